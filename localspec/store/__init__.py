"""Models on disk and where they come from: the verified cache (``cache``, the store's interface: callers
write ``from localspec.store import cache as store`` and ``store.resolve_model(spec)``), the Hugging Face
Hub (``hub``), package-index mirrors (``pypi_mirror``), and the one HTTP client they share (``http``).
"""

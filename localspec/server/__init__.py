"""``localspec serve``: an OpenAI-compatible HTTP API over the speculative engine (see app.py)."""

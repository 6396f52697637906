"""localspec's measurement scripts, run as modules from the repository root (``.venv/bin/python -m
scripts.bench.engine``); the table is README.md's. The set-up and test entry points beside them are shell."""

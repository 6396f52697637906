"""Trains an EAGLE-3 drafting head for a llama.cpp target on this machine (see __main__.py)."""

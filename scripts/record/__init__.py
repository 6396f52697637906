"""Recorders of what real editor clients send (tests/data/editor-sessions/), for replays against serve and
stock llama-server: the recording proxy is scripts.bench.agents' ``record``."""

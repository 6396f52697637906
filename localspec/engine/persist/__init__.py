"""What the engine keeps across sessions: the answer history and the measured pass costs."""

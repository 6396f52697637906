"""The decoder core: the draft-and-verify loop, the acceptance rule, sampling, text, constraints, stats."""

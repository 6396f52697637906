"""Timing scripts: what passes, rounds, rollbacks, indexes and front ends cost (figures, not asserts)."""

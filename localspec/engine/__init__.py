"""The speculative engine: models, drafters, verification, the planner and stats. No CLI or UI here."""

"""The speculative engine: models, proposers, verification, controller and stats. No CLI or UI here."""

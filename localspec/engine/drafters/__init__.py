"""Draft sources: the interface (base), the registry, and one module per drafter with its index beside it."""

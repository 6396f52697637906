"""The planner: what a round of each drafter is expected to yield and cost, and which one to run."""

"""Replays of recorded greedy answers through the real decoder on a simulated clock, to tune the planner."""

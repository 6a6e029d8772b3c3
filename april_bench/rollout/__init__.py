"""Rollout mechanics (the loop, the buffer) and the strategy protocol."""

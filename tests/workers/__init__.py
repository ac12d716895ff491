"""Tests of the workers layer (one job end to end)."""

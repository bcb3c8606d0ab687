"""Benchmarks: scripts that print figures; pytest does not collect them."""

"""Checks that the benchmark harness measures what it claims to (run: make bench-test)."""

"""Benchmarks and simulations: each module runs as `python -m benchmarks.NAME` from the repository root."""

"""Benchmarks printed by ``make bench``: ratios measured side by side in one process."""

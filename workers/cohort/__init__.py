"""Cohorts, K trials of one shape trained as one vectorized computation.

``grouping`` (which trials can share a cohort) is torch-free: the planner imports it.
"""

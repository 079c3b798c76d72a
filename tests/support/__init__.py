"""Test infrastructure shared by the tests, the service benchmark and ``make demo``."""

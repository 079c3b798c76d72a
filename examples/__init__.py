"""Runnable walk-throughs of kappa-sweep (``make demo`` runs :mod:`examples.demo`)."""

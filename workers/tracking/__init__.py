"""MLflow tracking: a run's logger and params, its metric writer and writer process, and reads.

Nothing here imports torch; MLflow loads with the modules that write or read runs.
"""

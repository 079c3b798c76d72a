"""MLflow tracking: a run's logger and params, its metric writer and writer process, and reads.

Nothing here imports torch; MLflow loads with the modules that write or read runs. Importing
the package makes the process's HTTP connections reset when they close
(:func:`workers.tracking.wire.reset_connections_on_close`).
"""

from workers.tracking.wire import reset_connections_on_close

reset_connections_on_close()

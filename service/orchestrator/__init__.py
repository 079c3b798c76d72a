"""Running sweeps: the supervisor (queue, reconcile, restarts, cancel), the launchers (a local
process or a Ray Job per sweep) and the driver that a launcher starts."""

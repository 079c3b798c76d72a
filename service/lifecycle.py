"""A sweep's lifecycle as the service runs it: queued -> running -> succeeded | failed |
cancelled. Which states are still active and which are final (the store's conditional
updates, the API's routes, the CLI's and the Python client's waits read them).

Pure Python, so the light modules (the API, the store, the REST client) may import it.
"""

from __future__ import annotations

from sweeps.status import SweepState

__all__ = ["ACTIVE_SWEEP_STATES", "TERMINAL_SWEEP_STATES"]

# Plain strings (``.value``): the store compares its column with them.
ACTIVE_SWEEP_STATES: tuple[str, ...] = (SweepState.QUEUED.value, SweepState.RUNNING.value)
TERMINAL_SWEEP_STATES: tuple[str, ...] = tuple(
    s.value for s in SweepState if s.value not in ACTIVE_SWEEP_STATES)

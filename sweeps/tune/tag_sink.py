"""The progress record mirrored onto the sweep's parent run: its counters, state and best value
as MLflow tags, so the MLflow UI shows where a sweep stands without the service."""

from __future__ import annotations

import logging
import time
from typing import Any

from mlflow.entities import RunTag

from sweeps.status import (
    BEST_VALUE_TAG,
    COUNTERS,
    STATE_TAG,
    SweepState,
    SweepStatus,
    counter_tag,
)
from workers.tracking.retry import retrying

__all__ = ["MlflowTagSink"]

log = logging.getLogger("ksweep.progress")


class MlflowTagSink:
    """Mirrors the counters onto the parent run's tags (at most every ``interval_s``).

    While the tracking server fails, running-state updates back off (doubling up to 60 s, so
    the Tune loop that publishes is not held up by every attempt); the final state is written
    with retries (``workers/tracking/retry.py``).
    """

    def __init__(self, client: Any, run_id: str, interval_s: float = 5.0) -> None:
        self.client, self.run_id, self.interval_s = client, run_id, interval_s
        self._last = 0.0
        self._backoff_s = 0.0

    def publish(self, status: SweepStatus) -> None:
        now = time.monotonic()
        if status.state == SweepState.RUNNING and now - self._last < max(self.interval_s, self._backoff_s):
            return
        self._last = now
        tags = {counter_tag(name): str(getattr(status, name)) for name in COUNTERS}
        tags[STATE_TAG] = status.state
        if status.best_value is not None:
            tags[BEST_VALUE_TAG] = f"{status.best_value:.6g}"
        def write() -> None:
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

        if status.state != SweepState.RUNNING:
            retrying(write, f"progress tags of run {self.run_id}")
            return
        try:
            write()
            self._backoff_s = 0.0
        except Exception as error:  # noqa: BLE001 (mirroring must never kill the sweep)
            self._backoff_s = min(60.0, max(2 * self._backoff_s, self.interval_s))
            log.warning("could not mirror progress onto run %s (next try in %.0f s): %s",
                        self.run_id, self._backoff_s, str(error).splitlines()[0][:300])

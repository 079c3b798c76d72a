"""Sweep progress: one small status record, published to sinks the service and CLI read."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from workers.contract import (
    BEST_VALUE_TAG,
    COUNTERS,
    STATE_TAG,
    SweepState,
    SweepStatus,
    counter_tag,
)

__all__ = ["MlflowTagSink", "ProgressSink", "StatusFileSink", "SweepStatus", "publish", "read_status"]

log = logging.getLogger("ksweep.progress")


class ProgressSink(Protocol):
    """Anything that wants sweep progress (a status file, MLflow tags, the service store)."""

    def publish(self, status: SweepStatus) -> None: ...


class StatusFileSink:
    """Writes ``status.json`` atomically (readers never see half a file)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def publish(self, status: SweepStatus) -> None:
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        staging.write_text(json.dumps(status.to_dict(), indent=2, sort_keys=True))
        staging.replace(self.path)


def read_status(path: Path | str) -> SweepStatus | None:
    """The last status written to ``path``, or None when there is none yet."""
    try:
        return SweepStatus.from_dict(json.loads(Path(path).read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class MlflowTagSink:
    """Mirrors the counters onto the parent run's tags (at most every ``interval_s``).

    While the tracking server fails, running-state updates back off (doubling up to 60 s, so
    the Tune loop that publishes is not held up by every attempt); the final state is written
    with retries (``workers/mlflow_retry.py``).
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
        from mlflow.entities import RunTag

        from workers.mlflow_retry import retrying

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


def publish(sinks: Iterable[ProgressSink], status: SweepStatus) -> None:
    """Send ``status`` to every sink."""
    status.updated_at = time.time()
    for sink in sinks:
        sink.publish(status)

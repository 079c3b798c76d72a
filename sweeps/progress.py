"""Sweep progress: one small status record, published to sinks the service and CLI read."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class SweepStatus:
    """Where a sweep stands. Counters always add up to ``total``.

    ``pending`` counts trials not started yet (including those the searcher has not
    created); ``stopped`` counts trials an early-stopping scheduler ended.
    """

    sweep_id: str
    state: str = "running"  # running | succeeded | failed | cancelled
    total: int = 0
    pending: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    stopped: int = 0
    best_metric: str | None = None
    best_value: float | None = None
    best_trial: str | None = None
    best_config: dict[str, Any] | None = None
    eta_seconds: float | None = None
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    error: str | None = None
    parent_run_id: str | None = None
    experiment_id: str | None = None
    trials: list[dict[str, Any]] = field(default_factory=list)
    """One dict per trial Tune knows of, in creation order: ``trial_id``, ``state``
    (pending | running | done | stopped | failed), ``config`` (alpha, loss_stack, model,
    seed), ``metrics`` (the latest finite DESIGN.md metrics), ``epochs``,
    ``mlflow_run_id`` and ``error``."""

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.stopped

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["best_value"] is not None and not math.isfinite(data["best_value"]):
            data["best_value"] = None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepStatus:
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{key: value for key, value in data.items() if key in known})


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
    """Mirrors the counters onto the parent run's tags (at most every ``interval_s``)."""

    def __init__(self, client: Any, run_id: str, interval_s: float = 5.0) -> None:
        self.client, self.run_id, self.interval_s = client, run_id, interval_s
        self._last = 0.0

    def publish(self, status: SweepStatus) -> None:
        now = time.monotonic()
        if status.state == "running" and now - self._last < self.interval_s:
            return
        self._last = now
        tags = {f"ksweep.trials_{name}": str(getattr(status, name))
                for name in ("total", "pending", "running", "done", "failed", "stopped")}
        tags["ksweep.state"] = status.state
        if status.best_value is not None:
            tags["ksweep.best_value"] = f"{status.best_value:.6g}"
        try:
            from mlflow.entities import RunTag

            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        except Exception:  # progress mirroring must never kill the sweep
            pass


def publish(sinks: Iterable[ProgressSink], status: SweepStatus) -> None:
    """Send ``status`` to every sink."""
    status.updated_at = time.time()
    for sink in sinks:
        sink.publish(status)

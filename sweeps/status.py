"""Sweep progress: one small status record, published to sinks the service and CLI read.

The record's names live here, the lowest layer that uses them (the driver writes them, the
service stores and shows them): the sweep and trial states, the counters and the parent
run's progress tags. Pure Python (no MLflow: the parent run's sink is
:mod:`sweeps.tune.tag_sink`), so the API, the store and the Python client import it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from workers.contract import TAG_PREFIX

__all__ = ["BEST_VALUE_TAG", "COUNTERS", "STATE_TAG", "ProgressSink",
           "StatusFileSink", "SweepState", "SweepStatus", "TrialState", "counter_tag", "finished_state",
           "publish", "read_status"]

log = logging.getLogger("ksweep.progress")

STATE_TAG = "ksweep.state"
"""On a sweep's parent run: its :class:`SweepState`."""
BEST_VALUE_TAG = "ksweep.best_value"


class SweepState(StrEnum):
    """A sweep's state: in the store's ``state`` column, the API's documents and the CLI (the
    values are stored and documented: never rename one)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TrialState(StrEnum):
    """A trial's state in the progress record, the API's trial list and the report (in the
    CLI's column order; the driver derives it from Tune's status or a cohort member's
    :class:`~workers.contract.TrainingStatus`)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"


# The progress record's counters: the store's columns, the parent run's tags, the API's
# ``counters`` (in this order); each but ``total`` counts the trials in that state.
COUNTERS: tuple[str, ...] = ("total", TrialState.PENDING.value, TrialState.RUNNING.value,
                             TrialState.DONE.value, TrialState.FAILED.value,
                             TrialState.STOPPED.value)


def finished_state(errored: bool, reached: int, epochs: int) -> str:
    """The :class:`TrialState` of a trial that ended: failed, done when it ran all ``epochs``,
    else stopped (early: its own early stopping, the scheduler or the sweep's time budget)."""
    if errored:
        return TrialState.FAILED.value
    return TrialState.DONE.value if reached >= epochs else TrialState.STOPPED.value


def counter_tag(counter: str) -> str:
    """The parent run's tag mirroring one trial counter (``ksweep.trials_done``...)."""
    return f"{TAG_PREFIX}trials_{counter}"


@dataclass
class SweepStatus:
    """Where a sweep stands. Counters always add up to ``total``.

    ``pending`` counts trials not started yet (including those the searcher has not
    created); ``stopped`` counts trials an early-stopping scheduler ended.
    """

    sweep_id: str
    state: str = SweepState.RUNNING.value  # a SweepState value: running, succeeded or failed
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
    """One dict per trial Tune knows of, in creation order: ``trial_id``, ``state`` (a
    :class:`TrialState` value), ``config`` (alpha, loss_stack, model, seed), ``metrics`` (the
    latest finite metrics named here), ``epochs``, ``mlflow_run_id`` and ``error``."""

    @property
    def finished(self) -> int:
        """Trials that ended, whichever way."""
        return self.done + self.failed + self.stopped

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; a non-finite best value becomes None."""
        data = asdict(self)
        if data["best_value"] is not None and not math.isfinite(data["best_value"]):
            data["best_value"] = None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepStatus:
        """The record from :meth:`to_dict`'s output; unknown keys are ignored."""
        known = set(cls.__dataclass_fields__)
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


def publish(sinks: Iterable[ProgressSink], status: SweepStatus) -> None:
    """Send ``status`` to every sink."""
    status.updated_at = time.time()
    for sink in sinks:
        sink.publish(status)

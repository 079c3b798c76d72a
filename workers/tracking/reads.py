"""Reading runs back from MLflow: a sweep's parent run, report and trial runs with their final
metrics and per-epoch histories; an experiment's runs; one metric's history.

The service's ``GET /sweeps/{id}/history`` and :func:`ksweep.frames.from_mlflow` both read
through here, so a sweep run by the service, by ``ksweep sweep run`` or on another cluster is
read the same way. MLflow is imported when a function runs (the module itself is light).
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.contract import (
    C_BASE_PARAM,
    HISTORY_METRICS,
    RUN_KIND_SWEEP,
    RUN_KIND_TAG,
    RUN_KIND_TRIAL,
    SHARED_BY_TAG,
    SWEEP_ID_TAG,
    TRIAL_ID_TAG,
    runs_with_tag_filter,
)

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

REPORT_ARTIFACT = "report.json"
DEFAULT_HISTORY_METRICS: tuple[str, ...] = HISTORY_METRICS
"""The curves ``/history`` returns when no ``metrics`` are asked for (the report's curves)."""
MAX_HISTORY_METRICS = 50


class SweepNotInMlflow(LookupError):
    """No sweep (or more than one) matches what was asked for; the message says which."""


@dataclass
class LoggedTrial:
    """One trial's MLflow run: its latest value of every metric and the rows it stands in."""

    trial_id: str
    run_id: str
    shared_by: list[str] = field(default_factory=list)
    final: dict[str, float | None] = field(default_factory=dict)
    c_base: float | None = None  # the run's c_base param (measured on the train split)


def _trial_run(trial_id: str, run: Any) -> LoggedTrial:
    c_base = run.data.params.get(C_BASE_PARAM)
    return LoggedTrial(trial_id=trial_id, run_id=run.info.run_id,
                       shared_by=[s for s in run.data.tags.get(SHARED_BY_TAG, "").split(",") if s],
                       final={k: _finite(v) for k, v in sorted(run.data.metrics.items())},
                       c_base=None if c_base in (None, "None") else float(c_base))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@functools.lru_cache(maxsize=8)
def _client(tracking_uri: str) -> Any:
    # One client per store and process: building a sqlite store checks its schema (seconds
    # on a loaded machine), which every history request would otherwise pay again.
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri)


def _all_experiment_ids(client: Any) -> list[str]:
    return [e.experiment_id for e in client.search_experiments()]


def _search(client: Any, experiment_ids: Sequence[str], filter_string: str) -> list[Any]:
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(list(experiment_ids), filter_string=filter_string,
                                  max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def find_parent_run(tracking_uri: str, experiment_or_sweep_id: str) -> Any:
    """The parent run of a sweep, given its sweep id, or an experiment id or name holding
    exactly one sweep.

    Raises:
        SweepNotInMlflow: nothing matches, or the experiment holds several sweeps (the
            message lists their ids: pass one of them).
    """
    client = _client(tracking_uri)
    by_id = _search(client, _all_experiment_ids(client), runs_with_tag_filter(
        **{SWEEP_ID_TAG: experiment_or_sweep_id, RUN_KIND_TAG: RUN_KIND_SWEEP}))
    if by_id:
        return max(by_id, key=lambda run: run.info.start_time or 0)
    experiment = client.get_experiment_by_name(experiment_or_sweep_id)
    if experiment is None and experiment_or_sweep_id.isdigit():
        try:
            experiment = client.get_experiment(experiment_or_sweep_id)
        except Exception:  # noqa: BLE001  (MLflow raises its own error type for a missing id)
            experiment = None
    if experiment is None:
        raise SweepNotInMlflow(
            f"{experiment_or_sweep_id!r} is neither a sweep id nor an experiment in "
            f"{tracking_uri}; `ksweep status` lists sweep ids, the MLflow UI experiments")
    parents = _search(client, [experiment.experiment_id],
                      runs_with_tag_filter(**{RUN_KIND_TAG: RUN_KIND_SWEEP}))
    sweeps = sorted({run.data.tags.get(SWEEP_ID_TAG, "") for run in parents})
    if len(sweeps) != 1:
        raise SweepNotInMlflow(
            f"experiment {experiment.name!r} holds {len(sweeps)} sweeps"
            + (f" ({', '.join(sweeps)}): pass one sweep id instead" if sweeps else ""))
    return max(parents, key=lambda run: run.info.start_time or 0)


def load_report(tracking_uri: str, parent_run_id: str) -> dict[str, Any] | None:
    """The parent run's ``report.json`` artifact, or None when the sweep wrote none (yet)."""
    client = _client(tracking_uri)
    names = {item.path for item in client.list_artifacts(parent_run_id)}
    if REPORT_ARTIFACT not in names:
        return None
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

    previous = os.environ.get(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name)
    # One small file: no "Downloading artifacts" bar in the caller's notebook or terminal.
    os.environ[MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name] = "false"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(parent_run_id, REPORT_ARTIFACT, tmp)
            report: dict[str, Any] = json.loads(Path(path).read_text())
    finally:
        if previous is None:
            os.environ.pop(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name, None)
        else:
            os.environ[MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name] = previous
    return report


def trial_runs(tracking_uri: str, sweep_id: str,
               experiment_id: str | None = None) -> list[LoggedTrial]:
    """Every trial run of the sweep, one per trial id (the newest when a trial was retried
    into a second run), sorted by trial id; an unknown sweep gives an empty list."""
    client = _client(tracking_uri)
    ids = [experiment_id] if experiment_id else _all_experiment_ids(client)
    runs = _search(client, ids, runs_with_tag_filter(
        **{SWEEP_ID_TAG: sweep_id, RUN_KIND_TAG: RUN_KIND_TRIAL}))
    newest: dict[str, Any] = {}
    for run in runs:
        trial_id = run.data.tags.get(TRIAL_ID_TAG)
        if trial_id and (trial_id not in newest or (run.info.start_time or 0)
                         > (newest[trial_id].info.start_time or 0)):
            newest[trial_id] = run
    return [_trial_run(trial_id, run) for trial_id, run in sorted(newest.items())]


def runs_by_id(tracking_uri: str, trials: Sequence[tuple[str, str]]) -> list[LoggedTrial]:
    """The runs of ``(trial_id, run_id)`` pairs, in that order: trials a sweep reused live in
    other sweeps' runs, found by run id (a run that is gone is left out)."""
    client = _client(tracking_uri)
    found = []
    for trial_id, run_id in trials:
        try:
            found.append(_trial_run(trial_id, client.get_run(run_id)))
        except Exception:  # noqa: BLE001  (MLflow raises its own error type for a missing run)
            continue
    return found


def reused_trials(report: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``(trial_id, run_id)`` of every trial a report lists as reused from another sweep."""
    return [(entry["trial_id"], entry["mlflow_run_id"]) for entry in (report or {}).get("reused", [])
            if entry.get("mlflow_run_id")]


def unknown_metrics(runs: Iterable[LoggedTrial], metrics: Sequence[str]) -> list[str]:
    """The asked-for metrics no run logged (empty when there are no runs yet)."""
    runs = list(runs)
    logged = {name for run in runs for name in run.final}
    return [m for m in metrics if runs and m not in logged]


def metric_points(tracking_uri: str, runs: Iterable[LoggedTrial], metrics: Sequence[str]
                  ) -> list[dict[str, Any]]:
    """Long format: one point per trial x metric x step (the epoch), in that order.

    A metric a run never logged contributes no points for that run; a NaN or infinite
    value is a point with value None (JSON has no NaN).
    """
    client = _client(tracking_uri)
    points: list[dict[str, Any]] = []
    for run in runs:
        for metric in metrics:
            if metric not in run.final:
                continue
            by_step: dict[int, float] = {}
            # A step logged twice (a retried epoch) keeps its latest value.
            for item in sorted(client.get_metric_history(run.run_id, metric),
                               key=lambda m: (m.step, m.timestamp)):
                by_step[int(item.step)] = float(item.value)
            points.extend({"trial_id": run.trial_id, "metric": metric, "step": step,
                           "value": _finite(value)}
                          for step, value in sorted(by_step.items()))
    return points


def find_runs(tracking_uri: str, experiment_name: str, filter_string: str = "") -> list[Run]:
    """All active runs of an experiment matching an MLflow search filter, every page.

    Returns:
        The runs, newest first (MLflow's default order); empty when the experiment does
        not exist.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return []
    runs: list[Run] = []
    page_token = None
    while True:
        page = client.search_runs(
            [experiment.experiment_id], filter_string=filter_string, page_token=page_token
        )
        runs.extend(page)
        page_token = page.token
        if not page_token:
            return runs


def metric_history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    """The ``(step, value)`` points of one metric, sorted by step (then by log time).

    Returns:
        Empty when the metric was never logged. NaN values come back as NaN.
    """
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return [(point.step, point.value) for point in points]

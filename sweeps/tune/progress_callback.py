"""From Tune's trial list to the sweep's progress record, published while the sweep runs.

A Tune callback is pickled into the experiment state, and the driver's live sinks (a rich
view, an MLflow client, the service store) cannot be; so the callback names its sweep, and
the driver that runs the sweep registers the status and sinks under that id in
:data:`LIVE`. A callback restored in a new driver process finds that process's sinks.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from ray import tune

from sweeps.plan.build import SEARCH_AXES
from sweeps.status import ProgressSink, SweepStatus, TrialState, finished_state, publish
from sweeps.tune.cohort_results import member_views
from sweeps.tune.search_space import MEMBERS, is_cohort
from workers.contract import METRIC_NAMES, TrainingStatus
from workers.tracking.run_end import end_run_by_id, run_end

log = logging.getLogger("ksweep.runner")


class LiveProgress:
    """The running sweeps of this process: sweep id -> (status, sinks, carried records).

    The carried records are the trials the running Tuner does not hold (earlier segments'
    and reused ones, :mod:`sweeps.tune.segments`): they count in the status beside its own.
    """

    def __init__(self) -> None:
        self._sweeps: dict[str, tuple[SweepStatus, list[ProgressSink]]] = {}
        self._carried: dict[str, list[dict[str, Any]]] = {}

    def register(self, status: SweepStatus, sinks: list[ProgressSink],
                 carried: list[dict[str, Any]] | None = None) -> None:
        self._sweeps[status.sweep_id] = (status, sinks)
        self._carried[status.sweep_id] = list(carried or [])

    def unregister(self, sweep_id: str) -> None:
        self._sweeps.pop(sweep_id, None)
        self._carried.pop(sweep_id, None)

    def get(self, sweep_id: str) -> tuple[SweepStatus, list[ProgressSink]] | None:
        return self._sweeps.get(sweep_id)

    def carried(self, sweep_id: str) -> list[dict[str, Any]]:
        return self._carried.get(sweep_id, [])


LIVE = LiveProgress()


class ProgressCallback(tune.Callback):
    """Recomputes the sweep's counters from Tune's trial list and publishes them."""

    def __init__(self, sweep_id: str, epochs: int, metric: str, mode: str, tracking_uri: str,
                 interval_s: float = 1.0):
        self.sweep_id, self.epochs = sweep_id, epochs
        self.metric, self.mode, self.tracking_uri = metric, mode, tracking_uri
        self.interval_s = interval_s
        self._last = 0.0
        self._durations: dict[str, float] = {}
        self._started: dict[str, float] = {}

    def on_trial_start(self, iteration, trials, trial, **info):
        self._started.setdefault(trial.trial_id, time.time())

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._finish(trial)
        self._close_run(trial, "FINISHED")
        self._publish(trials, force=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._finish(trial)
        self._close_run(trial, "FAILED")
        self._publish(trials, force=True)

    def _close_run(self, trial, status: str) -> None:
        """Backstop for a trial process that ended before closing its MLflow run (a trial
        the scheduler stopped is ended with sys.exit, and its actor may be killed)."""
        result = trial.last_result or {}
        if is_cohort(trial.config):  # each member's run (the cohort's own stop closes them first)
            views = member_views(trial.trial_id, trial.config, result, "RUNNING", self.epochs)
            closing = [(view["trial_id"], view["result"]) for view in views]
        else:
            closing = [(trial.trial_id, result)]
        closing = [(trial_id, result) for trial_id, result in closing if result.get("mlflow_run_id")]
        if not closing:
            return
        try:
            client = MlflowClient(tracking_uri=self.tracking_uri)
            running = self._running_runs(client, [result["mlflow_run_id"] for _, result in closing])
        except (MlflowException, OSError):  # the run's state is cosmetic next to the sweep's progress
            log.warning("could not read the MLflow runs of trial %s", trial.trial_id, exc_info=True)
            return
        for trial_id, result in closing:
            if result["mlflow_run_id"] in running:
                self._close_one(client, trial_id, result, status)

    @staticmethod
    def _running_runs(client: MlflowClient, run_ids: list[str]) -> set[str]:
        """Which of ``run_ids`` are still RUNNING: the first read alone (its experiment is the
        sweep's), the rest one query per 100 runs, not one per run (a 64-member cohort's reads
        one by one cost the driver about 1 s)."""
        first = client.get_run(run_ids[0]).info
        running = {first.run_id} if first.status == "RUNNING" else set()
        rest = run_ids[1:]
        for start in range(0, len(rest), 100):
            chunk = rest[start:start + 100]
            quoted = ", ".join(f"'{run_id}'" for run_id in chunk)
            runs = client.search_runs([first.experiment_id], f"attributes.run_id IN ({quoted})",
                                      max_results=len(chunk))
            running.update(run.info.run_id for run in runs if run.info.status == "RUNNING")
        return running

    def _close_one(self, client: MlflowClient, trial_id: str, result: dict[str, Any],
                   status: str) -> None:
        run_id = result["mlflow_run_id"]
        early = status == "FINISHED" and result.get("training_iteration", 0) < self.epochs
        state = TrainingStatus.FAILED if status == "FAILED" else TrainingStatus.STOPPED
        try:
            end_run_by_id(client, run_id, run_end(state, stopped_early=early))
        except (MlflowException, OSError):  # the run's state is cosmetic next to the sweep's progress
            log.warning("could not close the MLflow run %s of trial %s", run_id, trial_id,
                        exc_info=True)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._publish(trials)

    def on_step_end(self, iteration, trials, **info):
        self._publish(trials)

    def _finish(self, trial) -> None:
        if trial.trial_id in self._started:
            self._durations[trial.trial_id] = time.time() - self._started[trial.trial_id]

    def _publish(self, trials, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        live = LIVE.get(self.sweep_id)
        if live is None:
            return
        status, sinks = live
        update_status_from_trials(status, trials, self.epochs, self.metric, self.mode,
                                  LIVE.carried(self.sweep_id))
        if self._durations:
            # Durations are per Tune trial; a cohort Tune trial trains len(members) trials.
            mean = sum(self._durations.values()) / len(self._durations)
            sizes = [len(t.config[MEMBERS]) if is_cohort(t.config) else 1 for t in trials]
            per_tune_trial = sum(sizes) / len(sizes) if sizes else 1.0
            slots = max(1, sum(t.status in ("RUNNING", "PAUSED") for t in trials))
            status.eta_seconds = mean * (status.pending + status.running) / per_tune_trial / slots
        publish(sinks, status)


def _trial_state(trial, epochs: int) -> str:
    status = trial.status
    if status in ("ERROR", "TERMINATED"):
        reached = (trial.last_result or {}).get("training_iteration", 0)
        return finished_state(status == "ERROR", reached, epochs)
    if status in ("RUNNING", "PAUSED"):
        return TrialState.RUNNING.value
    return TrialState.PENDING.value


def trial_record(trial_id: str, state: str, config: dict[str, Any], result: dict[str, Any],
                 error: str | None = None) -> dict[str, Any]:
    """The per-trial entry of :attr:`SweepStatus.trials` (finite contract metrics only)."""
    metrics = {name: float(result[name]) for name in METRIC_NAMES
               if isinstance(result.get(name), int | float) and math.isfinite(result[name])}
    return {
        "trial_id": str(trial_id), "state": state,
        "config": {k: config.get(k) for k in SEARCH_AXES}, "metrics": metrics,
        "epochs": int(result.get("training_iteration", 0) or 0),
        "mlflow_run_id": result.get("mlflow_run_id"), "error": error,
    }


def _views(trials, epochs: int):
    """(trial_id, state, config, last result) per trial; a cohort's members one by one."""
    for trial in trials:
        if is_cohort(trial.config):
            for view in member_views(trial.trial_id, trial.config, trial.last_result,
                                     trial.status, epochs):
                yield view["trial_id"], view["state"], view["config"], view["result"]
        else:
            yield trial.trial_id, _trial_state(trial, epochs), trial.config, trial.last_result or {}


def _carried_views(records: list[dict[str, Any]]):
    for record in records:
        result = {**record["metrics"], "training_iteration": record["epochs"],
                  "mlflow_run_id": record["mlflow_run_id"]}
        yield record["trial_id"], record["state"], record["config"], result


def update_status_from_trials(status: SweepStatus, trials, epochs: int, metric: str, mode: str,
                              carried: list[dict[str, Any]] | None = None) -> None:
    """Counters, per-trial records and best-so-far from Tune's trials (the same after a restore)
    and the ``carried`` records (:meth:`LiveProgress.register`), which come first.

    A cohort Tune trial counts as its members: each is a trial with its own state and record."""
    counts = dict.fromkeys(TrialState, 0)
    best_value, best_trial, best_config = None, None, None
    records = []
    views = itertools.chain(_carried_views(carried or []), _views(trials, epochs))
    for trial_id, state, config, result in views:
        counts[state] += 1
        # The error text is read once, from the results, when the sweep ends.
        records.append(trial_record(trial_id, state, config, result))
        value = result.get(metric)
        if value is not None and isinstance(value, int | float) and math.isfinite(value) and (
            best_value is None or (value > best_value if mode == "max" else value < best_value)
        ):
            best_value, best_trial = float(value), trial_id
            best_config = {k: config.get(k) for k in SEARCH_AXES}
    status.done, status.failed = counts[TrialState.DONE], counts[TrialState.FAILED]
    status.stopped, status.running = counts[TrialState.STOPPED], counts[TrialState.RUNNING]
    started = status.done + status.failed + status.stopped + status.running
    status.pending = max(0, status.total - started)
    status.best_metric, status.best_value = metric, best_value
    status.best_trial, status.best_config = best_trial, best_config
    status.trials = records



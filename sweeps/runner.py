"""The Ray Tune driver: one spec in, a complete, comparable sweep out.

Tune state lives under ``<sweep_root>/<sweep_id>/tune``; started again for a sweep
whose state exists, the driver restores it and finishes the sweep without re-running
completed trials (their MLflow runs are kept, never duplicated).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from sweeps.progress import MlflowTagSink, ProgressSink, StatusFileSink, SweepStatus, publish
from sweeps.report import (
    TrialOutcome,
    build_report,
    report_markdown,
    summary_metrics,
    write_report_plots,
)
from sweeps.spec import SweepSpec
from sweeps.trainable import train_trial
from workers.contract import (
    FAILURE_TAG,
    MAX_ERROR_CHARS,
    METRIC_NAMES,
    NOTE_TAG,
    RUN_KIND_SWEEP,
    RUN_KIND_TAG,
    SEARCH_AXES,
    STOPPED_EARLY_TAG,
    SWEEP_ID_TAG,
    failure_text,
    runs_with_tag_filter,
)
from workers.tracking import RunLogger, ensure_experiment, flatten_config

log = logging.getLogger("ksweep.runner")
TUNE_FOLDER = "tune"
STATUS_FILE = "status.json"


def sweep_dir(sweep_root: Path | str, sweep_id: str) -> Path:
    return Path(sweep_root).resolve() / sweep_id


def ensure_ray(num_cpus: int | None = None, address: str | None = None) -> None:
    """Connect to RAY_ADDRESS / ``address``, or start a local Ray sized with ``num_cpus``."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)


def param_space(spec: SweepSpec) -> dict[str, Any]:
    """The Tune search space of the spec's axes."""
    stacks, models, seeds = spec.stack_labels(), list(spec.models), spec.seed_list()
    kind = spec.search.kind
    if kind == "grid":
        return {
            "alpha": tune.grid_search([float(a) for a in spec.alpha]),
            "loss_stack": tune.grid_search(stacks),
            "model": tune.grid_search(models),
            "seed": tune.grid_search(seeds),
        }
    low, high = spec.alpha.low, spec.alpha.high
    alpha = tune.loguniform(low, high) if spec.alpha.log else tune.uniform(low, high)
    space = {
        "alpha": alpha,
        "loss_stack": tune.choice(stacks) if len(stacks) > 1 else stacks[0],
        "model": tune.choice(models) if len(models) > 1 else models[0],
    }
    # Random search replicates every sampled configuration over the seeds; Optuna (one
    # configuration per trial) runs the spec's single seed.
    space["seed"] = tune.grid_search(seeds) if kind == "random" else seeds[0]
    return space


def _search_alg(spec: SweepSpec):
    if spec.search.kind != "optuna":
        return None
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    seed = spec.search.seed
    sampler = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
        "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
    }[spec.search.sampler]()
    metrics, modes = spec.objective.metrics, spec.objective_modes()
    multi = len(metrics) > 1
    searcher = OptunaSearch(
        metric=list(metrics) if multi else metrics[0], mode=list(modes) if multi else modes[0],
        sampler=sampler, seed=seed,
    )
    limit = spec.budget.max_concurrent_trials or spec.trial_count()
    return ConcurrencyLimiter(searcher, max_concurrent=max(1, limit))


def _scheduler(spec: SweepSpec):
    if spec.scheduler.kind == "asha":
        return ASHAScheduler(
            time_attr="training_iteration", metric=spec.primary_metric, mode=spec.primary_mode,
            max_t=spec.scheduler.max_t or spec.template.training.epochs,
            grace_period=spec.scheduler.grace_period, reduction_factor=spec.scheduler.reduction_factor,
        )
    return FIFOScheduler()


# The driver's live sinks (a rich view, an MLflow client, the service store) cannot be
# pickled into Tune's experiment state, so the callback finds them here by sweep id;
# a restored callback in a new driver process finds that driver's sinks.
_LIVE_PROGRESS: dict[str, tuple[SweepStatus, list[ProgressSink]]] = {}


class _ProgressCallback(tune.Callback):
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
        run_id = result.get("mlflow_run_id")
        if not run_id:
            return
        try:
            client = MlflowClient(tracking_uri=self.tracking_uri)
            if client.get_run(run_id).info.status != "RUNNING":
                return
            if status == "FINISHED" and result.get("training_iteration", 0) < self.epochs:
                client.set_tag(run_id, STOPPED_EARLY_TAG, "true")
            client.set_terminated(run_id, status)
        except (MlflowException, OSError):  # the run's state is cosmetic next to the sweep's progress
            log.warning("could not close the MLflow run %s of trial %s", run_id, trial.trial_id,
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
        if self.sweep_id not in _LIVE_PROGRESS:
            return
        status, sinks = _LIVE_PROGRESS[self.sweep_id]
        update_status_from_trials(status, trials, self.epochs, self.metric, self.mode)
        if self._durations:
            mean = sum(self._durations.values()) / len(self._durations)
            slots = max(1, status.running)
            status.eta_seconds = mean * (status.pending + status.running) / slots
        publish(sinks, status)


def _finished_state(errored: bool, reached: int, epochs: int) -> str:
    """A finished trial failed, ran its whole budget (done) or was stopped early by ASHA."""
    if errored:
        return "failed"
    return "done" if reached >= epochs else "stopped"


def _trial_state(trial, epochs: int) -> str:
    status = trial.status
    if status in ("ERROR", "TERMINATED"):
        reached = (trial.last_result or {}).get("training_iteration", 0)
        return _finished_state(status == "ERROR", reached, epochs)
    if status in ("RUNNING", "PAUSED"):
        return "running"
    return "pending"


def trial_record(trial_id: str, state: str, config: dict[str, Any], result: dict[str, Any],
                 error: str | None = None) -> dict[str, Any]:
    """The per-trial entry of :attr:`SweepStatus.trials` (finite DESIGN.md metrics only)."""
    metrics = {name: float(result[name]) for name in METRIC_NAMES
               if isinstance(result.get(name), int | float) and math.isfinite(result[name])}
    return {
        "trial_id": str(trial_id), "state": state,
        "config": {k: config.get(k) for k in SEARCH_AXES}, "metrics": metrics,
        "epochs": int(result.get("training_iteration", 0) or 0),
        "mlflow_run_id": result.get("mlflow_run_id"), "error": error,
    }


def update_status_from_trials(status: SweepStatus, trials, epochs: int, metric: str, mode: str) -> None:
    """Counters, per-trial records and best-so-far from Tune's trials (the same after a restore)."""
    counts = {"done": 0, "failed": 0, "stopped": 0, "running": 0, "pending": 0}
    best_value, best_trial, best_config = None, None, None
    records = []
    for trial in trials:
        state = _trial_state(trial, epochs)
        counts[state] += 1
        # The error text is read once, from the results, when the sweep ends.
        records.append(trial_record(trial.trial_id, state, trial.config, trial.last_result or {}))
        value = (trial.last_result or {}).get(metric)
        if value is not None and isinstance(value, int | float) and math.isfinite(value) and (
            best_value is None or (value > best_value if mode == "max" else value < best_value)
        ):
            best_value, best_trial = float(value), trial.trial_id
            best_config = {k: trial.config.get(k) for k in SEARCH_AXES}
    started = counts["done"] + counts["failed"] + counts["stopped"] + counts["running"]
    status.done, status.failed, status.stopped = counts["done"], counts["failed"], counts["stopped"]
    status.running = counts["running"]
    status.pending = max(0, status.total - started)
    status.best_metric, status.best_value = metric, best_value
    status.best_trial, status.best_config = best_trial, best_config
    status.trials = records


def _parent_run(client: MlflowClient, tracking_uri: str, spec: SweepSpec, sweep_id: str,
                experiment_name: str) -> RunLogger:
    """The sweep's parent run: found by its sweep id on a resume, else created and described."""
    experiment_id = ensure_experiment(client, experiment_name)
    existing = client.search_runs(
        [experiment_id],
        filter_string=runs_with_tag_filter(**{SWEEP_ID_TAG: sweep_id, RUN_KIND_TAG: RUN_KIND_SWEEP}),
    )
    if existing:
        return RunLogger.attach(tracking_uri, existing[0].info.run_id)
    logger = RunLogger.start(
        tracking_uri, experiment_name, f"sweep-{spec.name}-{sweep_id[:8]}",
        tags={SWEEP_ID_TAG: sweep_id, RUN_KIND_TAG: RUN_KIND_SWEEP, NOTE_TAG: spec.description,
              **{f"tag.{k}": v for k, v in spec.tags.items()}},
    )
    logger.log_params({
        "sweep.name": spec.name, "sweep.search": spec.search.kind,
        "sweep.scheduler": spec.scheduler.kind, "sweep.trials": spec.trial_count(),
        "sweep.objective": ",".join(spec.objective.metrics),
        "sweep.alpha": json.dumps(spec.alpha if isinstance(spec.alpha, list)
                                  else spec.alpha.model_dump()),
        "sweep.loss_stacks": ",".join(spec.stack_labels()), "sweep.models": ",".join(spec.models),
        "sweep.seeds": ",".join(str(s) for s in spec.seed_list()),
        **{f"template.{k}": v for k, v in flatten_config(
            spec.template.model_dump(mode="json", exclude={"loss_stack", "seed", "name"})).items()},
    })
    logger.log_dict_json(json.loads(spec.canonical_json()), "spec.json")
    return logger


@dataclass
class SweepOutcome:
    """What a finished driver returns."""

    sweep_id: str
    status: SweepStatus
    report: dict[str, Any]
    parent_run_id: str
    experiment_id: str
    outcomes: list[TrialOutcome] = field(default_factory=list)


def _outcomes(results, epochs: int) -> list[TrialOutcome]:
    from sweeps.report import REPORT_METRICS

    outcomes = []
    for result in results:
        metrics = result.metrics or {}
        config = result.config or {}
        trial_id = metrics.get("trial_id") or Path(result.path).name
        history: dict[str, list[float]] = {}
        frame = result.metrics_dataframe
        if frame is not None and len(frame):
            for name in REPORT_METRICS:
                if name in frame:
                    history[name] = [float(v) for v in frame[name].tolist()]
        reached = int(metrics.get("training_iteration", 0) or 0)
        state = _finished_state(result.error is not None, reached, epochs)
        outcomes.append(TrialOutcome(
            trial_id=str(trial_id), params={k: config.get(k) for k in SEARCH_AXES}, state=state,
            final={k: float(v) for k, v in metrics.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)},
            history=history, epochs=reached,
            error=None if result.error is None else str(result.error).strip()[-2000:],
            run_id=metrics.get("mlflow_run_id"),
        ))
    return outcomes


def run_sweep(
    spec: SweepSpec,
    *,
    sweep_id: str,
    sweep_root: Path | str,
    tracking_uri: str,
    num_cpus: int | None = None,
    ray_address: str | None = None,
    sinks: Sequence[ProgressSink] = (),
    experiment_name: str | None = None,
) -> SweepOutcome:
    """Run (or resume) a sweep to the end and write its report to the parent run."""
    folder = sweep_dir(sweep_root, sweep_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(spec.canonical_json())
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")  # small sweeps: save state often
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    # Per-epoch checkpoints of short trials force frequent state snapshots by design.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    experiment_name = experiment_name or spec.name
    client = MlflowClient(tracking_uri=tracking_uri)
    parent = _parent_run(client, tracking_uri, spec, sweep_id, experiment_name)
    status = SweepStatus(sweep_id=sweep_id, total=spec.trial_count(), pending=spec.trial_count(),
                         parent_run_id=parent.run_id, experiment_id=parent.experiment_id)
    all_sinks: list[ProgressSink] = [StatusFileSink(folder / STATUS_FILE),
                                     MlflowTagSink(client, parent.run_id), *sinks]
    publish(all_sinks, status)
    epochs = spec.template.training.epochs
    ensure_ray(num_cpus, ray_address)
    context = {
        "tracking_uri": tracking_uri, "experiment_name": experiment_name, "sweep_id": sweep_id,
        "parent_run_id": parent.run_id, "cache_root": str(Path(sweep_root).resolve()),
    }
    trainable = tune.with_resources(
        tune.with_parameters(train_trial, spec_json=spec.canonical_json(), context=context),
        {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
    )
    _LIVE_PROGRESS[sweep_id] = (status, all_sinks)
    callback = _ProgressCallback(sweep_id, epochs, spec.primary_metric, spec.primary_mode, tracking_uri)
    run_config = tune.RunConfig(
        name=TUNE_FOLDER, storage_path=str(folder), verbose=0, callbacks=[callback],
        failure_config=tune.FailureConfig(max_failures=spec.budget.max_failures_per_trial),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
    )
    tune_path = folder / TUNE_FOLDER
    try:
        if tune.Tuner.can_restore(str(tune_path)):
            tuner = tune.Tuner.restore(str(tune_path), trainable=trainable, resume_unfinished=True,
                                       resume_errored=False, restart_errored=False)
        else:
            multi = len(spec.objective.metrics) > 1
            tuner = tune.Tuner(
                trainable,
                param_space=param_space(spec),
                tune_config=tune.TuneConfig(
                    metric=None if multi or spec.search.kind == "optuna" else spec.primary_metric,
                    mode=None if multi or spec.search.kind == "optuna" else spec.primary_mode,
                    search_alg=_search_alg(spec), scheduler=_scheduler(spec),
                    num_samples=1 if spec.search.kind == "grid" else spec.search.num_samples,
                    max_concurrent_trials=spec.budget.max_concurrent_trials,
                    # No reuse_actors: it would pay a trial process's ~4 s of imports once per
                    # slot, but a completed trial was then re-run after a kill -9 and resume
                    # (tests/sweeps/test_runner.py), and resuming without re-running comes first.
                    time_budget_s=spec.budget.time_budget_s,
                ),
                run_config=run_config,
            )
        results = tuner.fit()
    except Exception as error:
        _LIVE_PROGRESS.pop(sweep_id, None)
        status.state, status.error = "failed", failure_text(error)
        publish(all_sinks, status)
        parent.set_tags({FAILURE_TAG: status.error})
        parent.finish("FAILED")
        raise
    _LIVE_PROGRESS.pop(sweep_id, None)
    outcomes = _outcomes(results, epochs)
    report = build_report(spec.name, sweep_id, outcomes, spec.primary_metric, spec.primary_mode)
    with tempfile.TemporaryDirectory(prefix="ksweep-report-") as tmp:
        (Path(tmp) / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False))
        (Path(tmp) / "report.md").write_text(report_markdown(report))
        parent.log_artifact(Path(tmp) / "report.json")
        parent.log_artifact(Path(tmp) / "report.md")
        for path in write_report_plots(report, outcomes, Path(tmp) / "plots"):
            parent.log_png(path)
    (folder / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    parent.log_metrics(summary_metrics(report), step=0)
    status.done = sum(o.state == "done" for o in outcomes)
    status.failed = sum(o.state == "failed" for o in outcomes)
    status.stopped = sum(o.state == "stopped" for o in outcomes)
    status.running = 0
    status.total = max(status.total, len(outcomes)) if spec.search.kind == "grid" else len(outcomes)
    status.pending = 0
    status.eta_seconds = 0.0
    status.trials = [
        trial_record(o.trial_id, o.state, o.params,
                     {**o.final, "training_iteration": o.epochs, "mlflow_run_id": o.run_id}, o.error)
        for o in outcomes
    ]
    if outcomes and status.done + status.stopped == 0:
        first = next((o.error for o in outcomes if o.error), "unknown error")
        status.state = "failed"
        status.error = f"all {len(outcomes)} trials failed; first error: {first}"[:MAX_ERROR_CHARS]
        parent.set_tags({FAILURE_TAG: status.error})
    else:
        status.state = "succeeded"
    publish(all_sinks, status)
    parent.finish("FINISHED" if status.state == "succeeded" else "FAILED")
    return SweepOutcome(sweep_id, status, report, parent.run_id, parent.experiment_id, outcomes)

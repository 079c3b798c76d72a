"""The Ray Tune driver: one spec in, a complete, comparable sweep out.

Tune state lives under ``<sweep_root>/<sweep_id>/tune`` (``tune-1``, ... for the segments a
grown sweep adds, :mod:`sweeps.tune.segments`); started again, the driver restores it and
finishes the sweep without re-running completed trials, and reuses trials of earlier sweeps
by content hash when the spec asks (:mod:`sweeps.tune.reuse`). :func:`run_sweep` prepares the
folder, opens the MLflow parent run, publishes progress, fits each segment's Tuner
(:mod:`sweeps.tune.segment_run`), then writes the report and the final status. MLflow writes
are retried through an outage of up to ``KSWEEP_MLFLOW_OUTAGE_S`` (``workers/tracking/retry.py``).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from sweeps.plan.budget import build_plan_within_budget
from sweeps.plan.build import SweepPlan
from sweeps.report.build import (
    TrialOutcome,
    build_report,
    report_markdown,
    summary_metrics,
    write_report_plots,
)
from sweeps.report.plots import RD_PLANE_PNG, prepare_plotting
from sweeps.report.predictions import record_predictions
from sweeps.report.summary_runs import publish_summary
from sweeps.spec import SweepSpec
from sweeps.spec.datasets import resolve_spec_data
from sweeps.status import (
    ProgressSink,
    StatusFileSink,
    SweepState,
    SweepStatus,
    TrialState,
    publish,
)
from sweeps.tune.progress_callback import trial_record
from sweeps.tune.segment_run import SegmentRun, run_segments
from sweeps.tune.setup import ensure_ray, local_ray_mode, param_space
from sweeps.tune.tag_sink import MlflowTagSink
from sweeps.tune.trial_context import TrialContext
from workers.contract import (
    FAILURE_TAG,
    LOCAL_MLFLOW_UI,
    MAX_ERROR_CHARS,
    RUN_KIND_SWEEP,
    RUN_KIND_TAG,
    SWEEP_ID_TAG,
    failure_text,
    runs_with_tag_filter,
)
from workers.tracking.params import flatten_config
from workers.tracking.retry import retrying
from workers.tracking.runs import RunLogger, ensure_experiment
from workers.tracking.writer_process import writer_process_min_runs

__all__ = ["STATUS_FILE", "SweepOutcome", "SweepSettings", "ensure_ray", "param_space",
           "run_sweep", "sweep_dir"]

STATUS_FILE = "status.json"
NOTE_TAG = "mlflow.note.content"  # the run description the MLflow UI shows

log = logging.getLogger("ksweep.runner")


def sweep_dir(sweep_root: Path | str, sweep_id: str) -> Path:
    return Path(sweep_root).resolve() / sweep_id


@dataclass
class SweepOutcome:
    """What a finished driver returns."""

    sweep_id: str
    status: SweepStatus
    report: dict[str, Any]
    parent_run_id: str
    experiment_id: str
    outcomes: list[TrialOutcome] = field(default_factory=list)


def _parent_run(tracking_uri: str, spec: SweepSpec, plan: SweepPlan, sweep_id: str,
                experiment_name: str) -> tuple[MlflowClient, RunLogger]:
    """The tracking client (a sqlite store is set up here) and the sweep's parent run: found by
    its sweep id on a resume, else created and described."""
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = ensure_experiment(client, experiment_name)
    existing = retrying(lambda: client.search_runs(
        [experiment_id],
        filter_string=runs_with_tag_filter(**{SWEEP_ID_TAG: sweep_id, RUN_KIND_TAG: RUN_KIND_SWEEP}),
    ), "search_runs (the parent run)")
    if existing:
        return client, RunLogger.attach(tracking_uri, existing[0].info.run_id)
    logger = RunLogger.start(
        tracking_uri, experiment_name, f"sweep-{spec.name}-{sweep_id[:8]}",
        tags={SWEEP_ID_TAG: sweep_id, RUN_KIND_TAG: RUN_KIND_SWEEP, NOTE_TAG: spec.description,
              **{f"tag.{k}": v for k, v in spec.tags.items()}},
    )
    logger.log_params({
        "sweep.name": spec.name, "sweep.search": spec.search.kind,
        "sweep.scheduler": spec.scheduler.kind, "sweep.trials": plan.trial_count,
        "sweep.cohort_size": plan.cohort_size,
        "sweep.objective": ",".join(spec.objective.metrics),
        "sweep.alpha": json.dumps(spec.alpha if isinstance(spec.alpha, list)
                                  else spec.alpha.model_dump()),
        "sweep.loss_stacks": ",".join(spec.stack_labels()), "sweep.models": ",".join(spec.models),
        "sweep.seeds": ",".join(str(s) for s in spec.seed_list()),
        **{f"template.{k}": v for k, v in flatten_config(
            spec.template.model_dump(mode="json", exclude={"loss_stack", "seed", "name"})).items()},
    })
    logger.log_dict_json(json.loads(spec.canonical_json()), "spec.json")
    return client, logger

def _prepare_folder(spec: SweepSpec, sweep_root: Path | str, sweep_id: str) -> Path:
    """``<sweep_root>/<sweep_id>`` with the spec in it."""
    folder = sweep_dir(sweep_root, sweep_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(spec.canonical_json())
    return folder

def _log_report(parent: RunLogger, report: dict[str, Any], outcomes: list[TrialOutcome],
                folder: Path) -> None:
    """report.json, report.md and the plots on the parent run; report.json in the folder."""
    with tempfile.TemporaryDirectory(prefix="ksweep-report-") as tmp:
        (Path(tmp) / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False))
        (Path(tmp) / "report.md").write_text(report_markdown(report))
        parent.log_artifact(Path(tmp) / "report.json")
        parent.log_artifact(Path(tmp) / "report.md")
        for path in write_report_plots(report, outcomes, Path(tmp) / "plots"):
            parent.log_png(path)
            if path.name == RD_PLANE_PNG:  # the rate-distortion plane also lies beside report.json
                shutil.copyfile(path, folder / RD_PLANE_PNG)
    (folder / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    parent.log_metrics(summary_metrics(report), step=0)


def _final_status(status: SweepStatus, spec: SweepSpec, outcomes: list[TrialOutcome]) -> None:
    """Counters and records from the outcomes; failed when no trial got anywhere."""
    status.done = sum(o.state == TrialState.DONE for o in outcomes)
    status.failed = sum(o.state == TrialState.FAILED for o in outcomes)
    status.stopped = sum(o.state == TrialState.STOPPED for o in outcomes)
    status.running = 0
    status.total = max(status.total, len(outcomes)) if spec.search.kind != "optuna" else len(outcomes)
    status.pending = 0
    status.eta_seconds = 0.0
    status.trials = [
        trial_record(o.trial_id, o.state, o.params,
                     {**o.final, "training_iteration": o.epochs, "mlflow_run_id": o.run_id}, o.error)
        for o in outcomes
    ]
    if outcomes and status.done + status.stopped == 0:
        first = next((o.error for o in outcomes if o.error), "unknown error")
        status.state = SweepState.FAILED.value
        status.error = f"all {len(outcomes)} trials failed; first error: {first}"[:MAX_ERROR_CHARS]
    else:
        status.state = SweepState.SUCCEEDED.value


@dataclass(frozen=True)
class SweepSettings:
    """Where and how :func:`run_sweep` runs a sweep: everything but the spec and its plan.

    Attributes:
        sweep_id: the sweep's id (a new one, or the one to resume).
        sweep_root: Tune state and caches live under ``<sweep_root>/<sweep_id>``.
        tracking_uri: the MLflow tracking store.
        num_cpus, ray_address: the local Ray's CPUs, or the Ray cluster to join.
        experiment_name: the MLflow experiment (default: the spec's name).
        mlflow_ui_url: the MLflow UI the report's saved-view links point at.
        data_root, model_root: the dataset store a spec naming a dataset reads and the model
            store a ``base.kind: causal_lm`` reads (each resolved to its hash once, before
            anything is written: :mod:`sweeps.spec.datasets`).
        sinks: who else hears the progress (the status file and the parent run's tags always do).
        extensions: a grown sweep's extension records (:mod:`service.api.routes.growth`), which
            the report reads; the spec is then the union of its axes.
        refresh: ``refresh(n)``, asked each time the trials known so far have ended, returns a
            newer spec and its ``n + k`` extension records when the sweep was extended
            meanwhile (else None): its new trials run before the report is written.
        reuse_from: the sweeps whose trials ``spec.reuse`` may take (None: every sweep of the
            tracking store).
        submitted_at: when the sweep was submitted (None: now), recorded with its predictions
            when its first segment starts (:mod:`sweeps.report.predictions`).
    """

    sweep_id: str
    sweep_root: Path | str
    tracking_uri: str
    num_cpus: int | None = None
    ray_address: str | None = None
    experiment_name: str | None = None
    mlflow_ui_url: str = LOCAL_MLFLOW_UI
    data_root: Path | str | None = None
    model_root: Path | str | None = None
    sinks: Sequence[ProgressSink] = ()
    extensions: Sequence[dict[str, Any]] = ()
    refresh: Callable[[int], tuple[SweepSpec, list[dict[str, Any]]] | None] | None = None
    reuse_from: Collection[str] | None = None
    submitted_at: datetime | None = None


def _resolve(spec: SweepSpec, plan: SweepPlan, settings: SweepSettings) -> tuple[SweepSpec, SweepPlan]:
    """The spec with its dataset and model resolved to their hashes, and its plan."""
    resolved = resolve_spec_data(spec, settings.data_root,
                                 sweep_dir(settings.sweep_root, settings.sweep_id) / "spec.json",
                                 model_root=settings.model_root)
    if resolved is not spec:  # the dataset's hash (and label-less defaults) change the trials
        return resolved, build_plan_within_budget(resolved)
    return spec, plan


def _start(spec: SweepSpec, plan: SweepPlan, settings: SweepSettings, experiment_name: str
           ) -> tuple[MlflowClient, RunLogger]:
    """The sweep's folder, then its parent run (and a sqlite store's set-up) and the report's
    plotting import while Ray starts, which is mostly a wait on Ray's own processes."""
    _prepare_folder(spec, settings.sweep_root, settings.sweep_id)
    with ThreadPoolExecutor(1, thread_name_prefix="ksweep-while-ray-starts") as pool:
        made = pool.submit(_parent_run, settings.tracking_uri, spec, plan, settings.sweep_id,
                           experiment_name)
        plotting = pool.submit(prepare_plotting)
        ensure_ray(settings.num_cpus, settings.ray_address)
        client, parent = made.result()
        plotting.result()
    return client, parent


def _log_extensions(parent: RunLogger, spec: SweepSpec, extensions: list[dict[str, Any]]) -> None:
    """A grown sweep's union spec and extension records beside the first spec's params."""
    parent.log_dict_json(json.loads(spec.canonical_json()), "spec.json")
    parent.log_dict_json(extensions, "extensions.json")


def run_sweep(spec: SweepSpec, plan: SweepPlan, settings: SweepSettings) -> SweepOutcome:
    """Run (or resume) a sweep to the end and write its report to the parent run.

    ``plan`` is the spec's (:func:`~sweeps.plan.budget.build_plan_within_budget`), built once
    by the caller; the parent run, the search space, the counters and the report all read it.
    ``settings``: where and how (:class:`SweepSettings`).

    The driver process should carry ``TUNE_ENV`` (:mod:`service.orchestrator.driver_env`) in its environment (the launchers and
    ``ksweep sweep run`` see to it); this function reads no environment variable itself
    beyond what Ray and Tune read, ``KSWEEP_LOCAL_RAY`` and ``KSWEEP_WRITER_PROCESS_MIN_RUNS``
    (both checked before anything is written).

    Raises:
        DatasetResolutionError: the spec's dataset is missing, its pin differs, or the spec
            asks what the dataset cannot give (before anything is written).
    """
    # Wrong values are refused here, not after the parent run is made (the trial workers
    # of a local Ray read the second from this process's environment).
    local_ray_mode()
    writer_process_min_runs()
    spec, plan = _resolve(spec, plan, settings)
    extensions = list(settings.extensions)
    sweep_id, folder = settings.sweep_id, sweep_dir(settings.sweep_root, settings.sweep_id)
    experiment_name = settings.experiment_name or spec.name
    client, parent = _start(spec, plan, settings, experiment_name)
    predictions = record_predictions(folder, spec, settings.submitted_at)  # once: the first segment's
    if extensions:  # the parent run's params are the first spec's; the union is logged beside them
        _log_extensions(parent, spec, extensions)
    status = SweepStatus(sweep_id=sweep_id, total=plan.trial_count, pending=plan.trial_count,
                         parent_run_id=parent.run_id, experiment_id=parent.experiment_id)
    all_sinks: list[ProgressSink] = [StatusFileSink(folder / STATUS_FILE),
                                     MlflowTagSink(client, parent.run_id), *settings.sinks]
    publish(all_sinks, status)
    context = TrialContext(
        tracking_uri=settings.tracking_uri, experiment_name=experiment_name, sweep_id=sweep_id,
        parent_run_id=parent.run_id, cache_root=str(Path(settings.sweep_root).resolve()),
        metric=spec.primary_metric, mode=spec.primary_mode, trial_plots=spec.tracking.trial_plots)
    segments = SegmentRun(sweep_id, folder, context, status, all_sinks, settings.reuse_from)
    try:
        while True:
            outcomes, environment_notes = run_segments(spec, plan, segments)
            grown = settings.refresh(len(extensions)) if settings.refresh is not None else None
            if grown is None:
                break
            # Extended while it ran: the new trials run now, the report waits for them.
            spec, plan = _resolve(grown[0], build_plan_within_budget(grown[0]), settings)
            extensions = grown[1]
            _prepare_folder(spec, settings.sweep_root, sweep_id)
            _log_extensions(parent, spec, extensions)
        report = build_report(spec, sweep_id, outcomes, plan, extensions=extensions,
                              predictions=predictions)
        report["limitations"] += environment_notes
        # Run again whole after a failure: it replaces the summary runs it had made.
        report["mlflow_views"] = retrying(lambda: publish_summary(
            settings.tracking_uri, experiment_name, parent.run_id, parent.experiment_id, report,
            settings.mlflow_ui_url),
            "publish_summary")
        _log_report(parent, report, outcomes, folder)
        _final_status(status, spec, outcomes)
        if status.state == SweepState.FAILED:
            parent.set_tags({FAILURE_TAG: status.error})
        publish(all_sinks, status)
    except Exception as error:
        # The parent run ends FAILED with the reason whatever failed, the status file
        # included (a full disk under the sweep root): MLflow may live elsewhere.
        status.state, status.error = SweepState.FAILED.value, failure_text(error)
        parent.set_tags({FAILURE_TAG: status.error})
        parent.finish("FAILED")
        try:
            publish(all_sinks, status)
        except Exception:
            log.warning("could not publish the failed status of sweep %s", sweep_id,
                        exc_info=True)
        raise
    parent.finish("FINISHED" if status.state == SweepState.SUCCEEDED else "FAILED")
    return SweepOutcome(sweep_id, status, report, parent.run_id, parent.experiment_id, outcomes)

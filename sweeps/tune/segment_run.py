"""Running a grown sweep's segments: each segment's Tuner, its results as trial outcomes.

:func:`run_segments` trains every trial of the plan that neither an earlier segment
(:mod:`sweeps.tune.segments`) nor a reused run of another sweep (:mod:`sweeps.tune.reuse`)
has: an unfinished segment is resumed from its Tune state, new trials become a new segment,
and the finished segments' outcomes are read back from disk. Progress counts every trial of
the sweep: the running Tuner's and the ones carried from before.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from sweeps.plan.build import SEARCH_AXES, SweepPlan, subplan
from sweeps.plan.identity import TRIAL_HASH, hash_trials, training_environment, trial_identity
from sweeps.report.readout_table import TrialOutcome
from sweeps.spec import SweepSpec
from sweeps.status import ProgressSink, SweepStatus, TrialState, finished_state
from sweeps.tune.cohort_results import member_state, saved_members
from sweeps.tune.member_runs import member_trial_id
from sweeps.tune.progress_callback import LIVE, ProgressCallback, trial_record
from sweeps.tune.reuse import find_reusable, reused_outcomes
from sweeps.tune.search_space import MEMBERS, is_cohort
from sweeps.tune.segments import Segment, load_segments, tune_folder, write_outcomes, write_segment
from sweeps.tune.setup import make_tuner
from sweeps.tune.state_backup import ExperimentStateBackup
from sweeps.tune.trial_context import TrialContext
from sweeps.tune.trial_entry import train_sweep_trial
from workers.contract import HISTORY_METRICS

__all__ = ["SegmentRun", "environment_words", "run_segments", "tune_outcomes"]


def _member_outcomes(result, epochs: int) -> list[TrialOutcome]:
    """A cohort's members as trial outcomes, from its last checkpoint's member records."""
    records: list[dict[str, Any]] = []
    if result.checkpoint is not None:
        with result.checkpoint.as_directory() as path:
            records = saved_members(path)
    error = None if result.error is None else str(result.error).strip()[-2000:]
    tune_state = "ERROR" if result.error is not None else "TERMINATED"
    cohort_id = str((result.metrics or {}).get("trial_id") or Path(result.path).name)
    outcomes = []
    for k, params in enumerate((result.config or {})[MEMBERS]):
        record = records[k] if k < len(records) else {}
        reached = int(record.get("epochs", 0))
        state = member_state(record.get("state"), tune_state, reached, epochs)
        outcomes.append(TrialOutcome(
            trial_id=record.get("trial_id") or member_trial_id(cohort_id, k),
            params={key: params.get(key) for key in SEARCH_AXES}, state=state,
            final=dict(record.get("final", {})), history=dict(record.get("history", {})),
            epochs=reached, error=record.get("error") or (error if state == TrialState.FAILED else None),
            run_id=record.get("run_id"), trial_hash=params.get(TRIAL_HASH),
        ))
    return outcomes


def tune_outcomes(results, epochs: int) -> list[TrialOutcome]:
    """Tune's result grid as trial outcomes (a cohort as its members)."""
    outcomes = []
    for result in results:
        metrics = result.metrics or {}
        config = result.config or {}
        if is_cohort(config):
            outcomes.extend(_member_outcomes(result, epochs))
            continue
        trial_id = metrics.get("trial_id") or Path(result.path).name
        history: dict[str, list[float]] = {}
        frame = result.metrics_dataframe
        if frame is not None and len(frame):
            for name in HISTORY_METRICS:
                if name in frame:
                    history[name] = [float(v) for v in frame[name].tolist()]
        reached = int(metrics.get("training_iteration", 0) or 0)
        state = finished_state(result.error is not None, reached, epochs)
        outcomes.append(TrialOutcome(
            trial_id=str(trial_id), params={k: config.get(k) for k in SEARCH_AXES}, state=state,
            final={k: float(v) for k, v in metrics.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)},
            history=history, epochs=reached,
            error=None if result.error is None else str(result.error).strip()[-2000:],
            run_id=metrics.get("mlflow_run_id"), trial_hash=config.get(TRIAL_HASH),
        ))
    return outcomes



def _fit(spec: SweepSpec, plan: SweepPlan, folder: Path, context: TrialContext,
         callback: ProgressCallback, experiment: str) -> Any:
    """Run (or resume) the Tuner of one segment (its folder ``experiment``) to the end;
    returns Tune's result grid."""
    trainable = tune.with_resources(
        tune.with_parameters(train_sweep_trial, configs=spec.trial_configs(), context=context),
        {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
    )
    # CSV and JSON: the result grid's metrics_dataframe is read from their files (TUNE_ENV turns
    # off Tune's automatic loggers, TensorBoard's among them).
    loggers = [CSVLoggerCallback(), JsonLoggerCallback()]
    run_config = tune.RunConfig(
        name=experiment, storage_path=str(folder), verbose=0,
        callbacks=[callback, ExperimentStateBackup(), *loggers],
        failure_config=tune.FailureConfig(max_failures=spec.budget.max_failures_per_trial),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
    )
    return make_tuner(spec, plan, trainable, run_config, folder / experiment).fit()


def _record(outcome: TrialOutcome) -> dict[str, Any]:
    return trial_record(outcome.trial_id, outcome.state, outcome.params,
                        {**outcome.final, "training_iteration": outcome.epochs,
                         "mlflow_run_id": outcome.run_id}, outcome.error)


@dataclass
class SegmentRun:
    """What :func:`run_segments` needs besides the spec and plan: the sweep's places and sinks."""

    sweep_id: str
    folder: Path
    context: TrialContext
    status: SweepStatus
    sinks: list[ProgressSink]
    reuse_from: Collection[str] | None

    def known(self, spec: SweepSpec, segments: list[Segment]) -> list[TrialOutcome]:
        """The outcomes of the finished segments and of every reused trial."""
        epochs = spec.template.training.epochs
        outcomes = [o for segment in segments for o in segment.outcomes or []]
        reused = [entry for segment in segments for entry in segment.reused]
        if reused:
            outcomes += reused_outcomes(self.context.tracking_uri, reused, epochs)
        return outcomes

    def fit(self, spec: SweepSpec, plan: SweepPlan, segment: Segment,
            carried: list[TrialOutcome]) -> None:
        """Train the segment's trials (resuming its Tuner) and keep their outcomes."""
        epochs = spec.template.training.epochs
        outcomes: list[TrialOutcome] = []
        if segment.trials:
            callback = ProgressCallback(self.sweep_id, epochs, spec.primary_metric,
                                        spec.primary_mode, self.context.tracking_uri)
            LIVE.register(self.status, self.sinks, [_record(o) for o in carried])
            try:
                results = _fit(spec, subplan(spec, plan, segment.trials), self.folder,
                               self.context, callback, tune_folder(segment.number))
            finally:
                LIVE.unregister(self.sweep_id)
            outcomes = tune_outcomes(results, epochs)
        write_outcomes(self.folder, segment, outcomes)

    def next_segment(self, spec: SweepSpec, plan: SweepPlan, segments: list[Segment],
                     known: list[TrialOutcome], environment: dict[str, Any]) -> Segment | None:
        """The plan's trials no segment has yet, as a new segment (less those reused from
        other sweeps when the spec asks); None when every trial has its segment."""
        if spec.search.kind == "optuna":  # its plan holds distributions: one segment, never grown
            if segments:
                return None
            segment = Segment(0, plan.trials, [], environment)
            write_segment(self.folder, segment)
            return segment
        covered = {trial_identity(spec, outcome.params) for outcome in known}
        missing = [trial for trial in plan.trials if trial_identity(spec, trial) not in covered]
        if not missing:
            return None
        reused = [] if spec.reuse == "none" else find_reusable(
            self.context.tracking_uri, missing, self.sweep_id, self.reuse_from)
        taken = {id(entry["trial"]) for entry in reused}
        segment = Segment(len(segments), [t for t in missing if id(t) not in taken], reused,
                          environment)
        write_segment(self.folder, segment)
        return segment


def environment_words(segments: list[Segment]) -> list[str]:
    """What the report says when a sweep's segments trained under different environments (a
    torch upgrade or changed training code between a sweep and its extension)."""
    trained = [s for s in segments if s.trials and s.environment]
    differing = [key for key in ("torch_version", "device_type", "precision", "code_digest",
                                 "compat_version")
                 if len({str(s.environment.get(key)) for s in trained}) > 1]
    if not differing:
        return []
    return [f"The sweep's segments trained under different environments ({', '.join(differing)}"
            f" differ between segments {', '.join(str(s.number) for s in trained)}): its trials "
            "are not all the same computation; compare across segments with care."]


def run_segments(spec: SweepSpec, plan: SweepPlan, run: SegmentRun
                 ) -> tuple[list[TrialOutcome], list[str]]:
    """Every trial of the plan: trained in its segment (earlier segments' outcomes are read
    back, an unfinished one resumed, new trials made a new segment) or reused; and the words
    of :func:`environment_words`."""
    environment = training_environment(spec)
    hash_trials(spec, plan.trials, environment)
    run.status.total = plan.trial_count
    segments = load_segments(run.folder)
    if not segments and (run.folder / tune_folder(0)).exists():
        # A sweep whose driver ran before segments were kept: its Tuner holds the whole plan.
        segments = [Segment(0, plan.trials, environment=asdict(environment))]
        write_segment(run.folder, segments[0])
    while True:
        for segment in segments:
            if not segment.finished:
                others = run.known(spec, [s for s in segments if s is not segment])
                run.fit(spec, plan, segment, others)
        known = run.known(spec, segments)
        segment = run.next_segment(spec, plan, segments, known, asdict(environment))
        if segment is None:
            return known, environment_words(segments)
        segments.append(segment)

"""The Ray Tune trainable of a cohort: one Tune trial trains K trials of one shape together.

The members train as one :class:`workers.cohort.trainer.Cohort` and each keeps everything a
lone trial has: its own MLflow run and tags (``ksweep.cohort`` beside its ``ksweep.trial_id``),
one metric point per epoch, its plots, its end state and its own checkpoint
(:func:`train_cohort` says how the runs and checkpoints are kept). The cohort reports to Tune
once per epoch; the report and the progress read the members from its checkpoint
(:mod:`sweeps.tune.cohort_results`).
"""

from __future__ import annotations

import json
import math
import tempfile
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.tracking import MlflowClient
from ray import tune

from sweeps.tune.search_space import MEMBERS
from sweeps.tune.state_backup import restored_as, seal_checkpoint
from sweeps.tune.trainable import (
    delete_leftover_runs,
    new_trial_run,
    open_trial_run,
    trial_run_options,
)
from workers.contract import HISTORY_METRICS, METRIC_NAMES, TrainingStatus, failure_text
from workers.tracking.run_end import end_run_by_id, run_end
from workers.tracking.writer import create_run_later

if TYPE_CHECKING:  # the training stack is imported where a trial runs: the driver never loads torch
    from sweeps.spec.trials import TrialConfigs
    from sweeps.tune.trial_context import TrialContext
    from workers.cohort.chunked import ChunkedCohort
    from workers.cohort.trainer import Cohort, Member
    from workers.trial import TrialRunner

MEMBERS_FILE = "members.json"
ENDED = frozenset(TrainingStatus) - {TrainingStatus.RUNNING}
COHORT_TAG = "ksweep.cohort"
"""On a trial run trained in a cohort: the Tune trial id of its cohort (absent for a lone trial)."""
COHORT_MEMBERS_KEY = "cohort_members"
"""Key of a cohort Tune trial's report: its members' progress records as one JSON string."""


def member_trial_id(cohort_trial_id: str, position: int) -> str:
    """The trial id of member ``position`` of the cohort that Tune runs as ``cohort_trial_id``."""
    return f"{cohort_trial_id}-m{position}"


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def progress_record(record: dict[str, Any]) -> dict[str, Any]:
    """The compact part of a member record that goes into every report (progress, best)."""
    final = record.get("final") or {}
    return {"trial_id": record["trial_id"], "state": record["state"], "epochs": record["epochs"],
            "run_id": record["run_id"], "error": record["error"],
            "metrics": {k: final[k] for k in METRIC_NAMES if isinstance(final.get(k), float)
                        and math.isfinite(final[k])}}


def _close(member: Member, run: TrialRunner | None) -> None:
    """End a member's run the way a lone trial's run ends (:meth:`TrialRunner.end`); None: a
    member replayed after its run had ended (nothing to write)."""
    if run is not None:
        run.end(run_end(member.status, member.error))


def _close_leftover(client: MlflowClient, record: dict[str, Any]) -> None:
    """A member that ended before a kill, whose run the kill left RUNNING: end it now."""
    if record.get("run_id") and client.get_run(record["run_id"]).info.status == "RUNNING":
        end_run_by_id(client, record["run_id"], run_end(record["state"], record.get("error")))


class _CohortTrial:
    """The state of one cohort Tune trial: its members' records, runs and cohort."""

    def __init__(self, params: dict[str, Any], configs: TrialConfigs, context: TrialContext) -> None:
        self.members: list[dict[str, Any]] = params[MEMBERS]
        self.context = context
        self.cohort_id = tune.get_context().get_trial_id()
        self.configs = [configs.trial_config_for(m) for m in self.members]
        self.records: list[dict[str, Any]] = [
            {"trial_id": member_trial_id(self.cohort_id, k), "params": member,
             "state": TrainingStatus.RUNNING.value, "epochs": 0, "run_id": None, "error": None,
             "final": {}, "history": {}}
            for k, member in enumerate(self.members)]
        self.running: list[int] = []
        self.runs: list[TrialRunner | None] = []  # None: replayed, its run already ended (or not made yet)
        self.making: dict[int, Future[tuple[str, str]]] = {}  # position -> its run being made
        self.unclosed: list[int] = []  # positions that ended but whose runs are not ended yet

    def open(self, folder: Path | None) -> Cohort | ChunkedCohort | None:
        """The cohort of the members still running (resumed from ``folder`` when given); its
        metric writer process was started by the trial's entry (sweeps/tune/trial_entry.py)."""
        if folder is not None:
            saved = json.loads((folder / MEMBERS_FILE).read_text())
            self.records = saved
            client = MlflowClient(tracking_uri=self.context.tracking_uri)
            for record in saved:
                if record["state"] in ENDED:
                    _close_leftover(client, record)
        self.running = [k for k, r in enumerate(self.records) if r["state"] == TrainingStatus.RUNNING]
        if not self.running:  # every member ended before the restore: nothing re-runs
            return None
        from workers.cohort.chunked import open_cohort
        from workers.trial import run_constants

        checkpoints = ({i: folder / f"member_{k}.pt" for i, k in enumerate(self.running)}
                       if folder is not None else None)
        cohort = open_cohort([self.configs[k] for k in self.running], self.context.cache_root,
                             checkpoints)
        self.runs = []
        client = MlflowClient(tracking_uri=self.context.tracking_uri)
        fresh = {self.records[k]["trial_id"] for k in self.running if not self.records[k]["run_id"]}
        if fresh:  # one search for the cohort: every member's run carries the cohort's tag
            delete_leftover_runs(self.context, {COHORT_TAG: self.cohort_id}, fresh)
        for position, (member, k) in enumerate(zip(cohort.members, self.running, strict=True)):
            record = self.records[k]
            record["final"].update(run_constants(member.trainer))
            if not record["run_id"]:
                # Made by the metric writer while the first epoch trains (its process's
                # store work on the other core): the runs are waited for before the epoch is
                # logged (_made), so every checkpoint still names them.
                self.runs.append(None)
                self.making[position] = create_run_later(new_trial_run(
                    member.trainer, self.members[k], self.context, record["trial_id"],
                    {COHORT_TAG: self.cohort_id}))
            elif client.get_run(record["run_id"]).info.status != "RUNNING":
                # Its run ended under a driver killed before Tune saw the checkpoint that
                # says so (as sweeps/tune/trainable.py's lone trial): the run is whole, so the
                # member only replays its last epochs from the checkpoint's exact state for
                # its record, and touches nothing in MLflow.
                self.runs.append(None)
            else:
                self.runs.append(open_trial_run(member.trainer, self.members[k], self.context,
                                                record["trial_id"], record["run_id"]))
        return cohort

    def _made(self, cohort: Cohort | ChunkedCohort, raising: bool = True) -> None:
        """Wait for the runs :meth:`open` had made; ``raising`` False: a run that could not be
        made stays None (nothing to end), as when the trial fails."""
        from workers.trial import TrialRunner

        while self.making:
            position = next(iter(self.making))
            future = self.making.pop(position)
            try:
                run_id, experiment_id = future.result()
            except Exception:
                if raising:
                    raise
                continue
            self.runs[position] = TrialRunner.created(
                cohort.members[position].trainer, self.context.tracking_uri, run_id,
                experiment_id, **trial_run_options(self.context))
            self.records[self.running[position]]["run_id"] = run_id

    def epoch(self, cohort: Cohort | ChunkedCohort) -> None:
        """Train one epoch, log it per member; the members that ended go to ``unclosed``."""
        # Each member queued as soon as its epoch end is done: the write overlaps the next one's.
        def on_member(position: int, metrics: dict[str, float]) -> None:
            self._made(cohort)  # the first one waits for the runs being made, if any
            self._log_member(cohort.members[position], position, metrics)

        logged = cohort.run_epoch(on_member=on_member)
        for position, member in enumerate(cohort.members):
            record = self.records[self.running[position]]
            if position in logged or record["state"] in ENDED:
                continue
            if member.status == TrainingStatus.FAILED:
                record.update(state=TrainingStatus.FAILED.value, error=member.error)
                self.unclosed.append(position)

    def _log_member(self, member, position: int, metrics: dict[str, float]) -> None:
        """Member ``position``'s epoch: finalized if it ended, queued for its run, recorded."""
        from workers.cohort.member import own_rng
        from workers.trial import run_constants

        record = self.records[self.running[position]]
        if member.status in (TrainingStatus.FINISHED, TrainingStatus.STOPPED):  # its lone last epoch
            with own_rng(member):
                metrics = {**metrics, **member.trainer.finalize()}
            self.unclosed.append(position)
        if self.runs[position] is not None:
            self.runs[position].log_epoch(metrics)
        history = member.trainer.history
        record.update(state=member.status, epochs=member.trainer.epoch, final={
            **_numbers(metrics), **_numbers(run_constants(member.trainer)),
            "training_iteration": float(member.trainer.epoch)},
            history={k: list(history[k]) for k in HISTORY_METRICS if k in history})

    def close_ended(self, cohort: Cohort | ChunkedCohort) -> None:
        self._made(cohort)
        while self.unclosed:
            position = self.unclosed.pop(0)
            _close(cohort.members[position], self.runs[position])

    def report(self, cohort: Cohort | ChunkedCohort | None, metric: str, mode: str) -> None:
        """One tune.report for the cohort, with every member's checkpoint and record (None:
        every member ended, records only)."""
        if cohort is not None:
            self._made(cohort)
        values = [r["final"].get(metric) for r in self.records]
        values = [v for v in values if v is not None and math.isfinite(v)]
        best = (max(values) if mode == "max" else min(values)) if values else math.nan
        with tempfile.TemporaryDirectory(prefix="ksweep-cohort-") as folder:
            for position, member in enumerate(cohort.members if cohort is not None else []):
                if member.status == TrainingStatus.RUNNING:
                    cohort.save_checkpoint(member, Path(folder) / f"member_{self.running[position]}.pt")
            (Path(folder) / MEMBERS_FILE).write_text(json.dumps(self.records))
            seal_checkpoint(Path(folder))
            for run in self.runs:  # MLflow holds every epoch before Tune records the checkpoint
                if run is not None:
                    run.settle()
            tune.report({metric: best, "cohort_size": float(len(self.records)),
                         COHORT_MEMBERS_KEY: json.dumps([progress_record(r) for r in self.records])},
                        checkpoint=tune.Checkpoint.from_directory(folder))

    def stop_running(self, cohort: Cohort | ChunkedCohort, error: BaseException | None) -> None:
        """End the runs of members still running: stopped early (Tune's stop) or failed."""
        self._made(cohort, raising=False)
        self.close_ended(cohort)
        for position, member in enumerate(cohort.members):
            if member.status != TrainingStatus.RUNNING or self.records[self.running[position]]["state"] in ENDED:
                continue
            run = self.runs[position]
            if run is None:
                continue
            if error is None:
                run.end(run_end(TrainingStatus.STOPPED, stopped_early=True))
            else:
                member.status, member.error = TrainingStatus.FAILED.value, failure_text(error)
                _close(member, run)


def train_cohort(params: dict[str, Any], *, configs: TrialConfigs, context: TrialContext) -> None:
    """Tune function trainable of a cohort. ``params[members]``: each member's lone params;
    ``context.metric`` and ``context.mode``: what the cohort reports to Tune as its own value.

    A member's run is made by the metric writer's process while the first epoch trains, and
    waited for before that epoch is logged (each epoch chunk by chunk where the device cannot
    hold every member: :mod:`workers.cohort.chunked`). A member's epoch is queued for the
    writer thread and every run is settled before the cohort's ``tune.report``: a checkpoint
    holds no epoch MLflow lacks unless the server is failing. The checkpoint holds each running
    member's ``member_{k}.pt`` and ``members.json`` (every member's state, run id, epochs,
    error, last metrics with ``selected/*`` and ``c_base``, the report curves). A restored
    cohort re-runs no member that ended, and a fresh start deletes a member's leftover run
    first, so no member ever has two runs.
    """
    trial = _CohortTrial(params, configs, context)
    checkpoint = tune.get_checkpoint()
    behind = False
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            cohort = trial.open(Path(folder))
            behind = restored_as(Path(folder)) is not None
    else:
        cohort = trial.open(None)
    if behind:  # Tune restored an older checkpoint's records: one report brings them up to date
        trial.report(cohort, context.metric, context.mode)
    if cohort is None:
        return
    try:
        while cohort.active:
            trial.epoch(cohort)
            trial.report(cohort, context.metric, context.mode)
            trial.close_ended(cohort)
    except SystemExit:  # Tune stopped the trial (time budget, cancel): as a lone trial
        trial.stop_running(cohort, None)
        raise
    except Exception as error:
        trial.stop_running(cohort, error)
        raise

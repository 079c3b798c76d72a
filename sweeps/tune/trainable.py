"""The Ray Tune trainable: one Tune trial trains a cohort of K >= 1 members (:func:`train_tune_trial`).

Every member keeps everything a trial has: its own MLflow run (made, attached and ended
through :class:`sweeps.tune.member_runs.MemberRuns` and :class:`workers.trial.TrialRunner`, by
the one rule of :mod:`workers.tracking.run_end`), one metric point per epoch, its plots, its end
state and its checkpoint. K > 1 members train stacked (:func:`workers.cohort.chunked.open_cohort`);
K = 1 trains on its lone trainer (:class:`workers.cohort.solo.SoloCohort`), at a lone trial's
cost. It runs in the trial's process, possibly on another node: every place it needs comes in
the :class:`~sweeps.tune.trial_context.TrialContext`.

Each epoch, in this order: the members' epoch, each member's metrics queued for its run as
soon as its epoch end is done, every run settled, then one ``tune.report`` with a checkpoint
(a checkpoint holds no epoch MLflow lacks unless the server is failing), then the runs of the
members that ended are ended. Tune hears a trial in one of two layouts
(:mod:`sweeps.tune.trial_layouts`): a lone trial's (its Tune config without ``members``: every
epoch's metrics, ``state.pt`` and ``run.json``, so ASHA and the result grid read it as any
Tune trial) or a cohort's (the members' records). A restored trial re-runs no member that
ended; a fresh start deletes a member's leftover run first, so no member ever has two runs.
"""

from __future__ import annotations

import contextlib
import math
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import tune

from sweeps.tune.cohort_results import ENDED
from sweeps.tune.member_runs import COHORT_TAG, MemberRuns, member_trial_id
from sweeps.tune.search_space import MEMBERS, is_cohort, lone_params
from sweeps.tune.state_backup import restored_as
from sweeps.tune.trial_layouts import CohortLayout, LoneLayout
from workers.contract import HISTORY_METRICS, TRIAL_ID_TAG, TrainingStatus, failure_text
from workers.tracking.run_end import run_end

if TYPE_CHECKING:  # the training stack is imported where a trial runs: the driver never loads torch
    from sweeps.spec.trials import TrialConfigs
    from sweeps.tune.trial_context import TrialContext
    from sweeps.tune.trial_layouts import Engine
    from workers.trial import TrialRunner

__all__ = ["TuneTrial", "train_tune_trial"]


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


class TuneTrial:
    """One Tune trial: its members' params, records, runs and the engine that trains them."""

    def __init__(self, params: dict[str, Any], configs: TrialConfigs, context: TrialContext) -> None:
        self.lone = not is_cohort(params)  # a trial of one from a lone Tune config
        self.members: list[dict[str, Any]] = [lone_params(params)] if self.lone else params[MEMBERS]
        self.context = context
        self.member_runs = MemberRuns(context)
        self.tune_id = tune.get_context().get_trial_id()
        self.layout = LoneLayout(self) if self.lone else CohortLayout(self)
        self.configs = [configs.trial_config_for(m) for m in self.members]
        self.records: list[dict[str, Any]] = [
            {"trial_id": self.tune_id if self.lone else member_trial_id(self.tune_id, k), "params": member,
             "state": TrainingStatus.RUNNING.value, "epochs": 0, "run_id": None, "error": None,
             "final": {}, "history": {}}
            for k, member in enumerate(self.members)]
        self.running: list[int] = []  # the positions the engine trains, in its order
        self.runs: list[TrialRunner | None] = []  # None: replayed, its run already ended (or not made yet)
        self.making: dict[int, Future[tuple[str, str]]] = {}  # position -> its run being made
        self.unclosed: list[int] = []  # positions that ended but whose runs are not ended yet
        self.last: dict[int, dict[str, float]] = {}  # each position's last epoch's metrics

    # -- opening -------------------------------------------------------------------------

    def open_runs(self, engine: Engine) -> None:
        """Each trained member's run: made when it has none yet (a cohort's by the metric writer
        while the first epoch trains; a trial of one's now: its first epoch has nothing to
        overlap), None when it ended under a killed driver (the member only replays its last epochs from
        the checkpoint's exact state, touching nothing in MLflow), else attached."""
        from workers.trial import run_constants

        fresh = {self.records[k]["trial_id"] for k in self.running if not self.records[k]["run_id"]}
        if fresh:  # one search for the trial's leftover runs
            tags = {TRIAL_ID_TAG: self.tune_id} if self.lone else {COHORT_TAG: self.tune_id}
            self.member_runs.delete_leftovers(tags, fresh)
        self.runs = []
        for position, (member, k) in enumerate(zip(engine.members, self.running, strict=True)):
            record = self.records[k]
            record["final"].update(run_constants(member.trainer))
            if not record["run_id"] and self.lone:  # one run: made now, nothing to overlap it with
                new_run = self.member_runs.new_run(member.trainer, self.members[k], record["trial_id"])
                self.runs.append(self.member_runs.created(member.trainer, *new_run.create()))
                record["run_id"] = self.runs[-1].logger.run_id
            elif not record["run_id"]:
                self.runs.append(None)  # waited for before its first epoch is logged (wait_for_runs)
                self.making[position] = self.member_runs.make_later(
                    member.trainer, self.members[k], record["trial_id"], {COHORT_TAG: self.tune_id})
            elif self.layout.run_ended(record["run_id"]):
                self.runs.append(None)
            else:
                run = self.member_runs.attach(member.trainer, record["run_id"])
                self.runs.append(run)
                if member.status != TrainingStatus.RUNNING:  # restored at its end: end the run
                    with self.member_rng(engine, member):
                        run.log_final()
                    self.unclosed.append(position)

    def wait_for_runs(self, engine: Engine, raising: bool = True) -> None:
        """Wait for the runs :meth:`open_runs` had made; ``raising`` False: a run that could not
        be made stays None (nothing to end), as when the trial fails."""
        while self.making:
            position = next(iter(self.making))
            future = self.making.pop(position)
            try:
                run_id, experiment_id = future.result()
            except Exception:
                if raising:
                    raise
                continue
            self.runs[position] = self.member_runs.created(engine.members[position].trainer,
                                                           run_id, experiment_id)
            self.records[self.running[position]]["run_id"] = run_id

    # -- training ------------------------------------------------------------------------

    @staticmethod
    def member_rng(engine: Engine, member) -> contextlib.AbstractContextManager:
        """The member's own RNG streams around its lone steps (finalize): a stacked cohort's
        are swapped in; a trial of one's are the process's."""
        from workers.cohort.member import own_rng

        return engine.member_rng(member) if hasattr(engine, "member_rng") else own_rng(member)

    def train(self, engine: Engine) -> None:
        """Epochs until no member runs (the module doc's order); on Tune's stop (``SystemExit``:
        a scheduler, the time budget, a cancel) or an error, the runs still open are ended."""
        try:
            while engine.active:
                self.epoch(engine)
                self.layout.report(engine)
                self.close_ended(engine)
            self.close_ended(engine)  # a member restored at its end
        except SystemExit:
            self.stop_running(engine, None)
            raise
        except Exception as error:
            self.stop_running(engine, error)
            raise

    def epoch(self, engine: Engine) -> None:
        """Train one epoch, log it per member; the members that ended go to ``unclosed``."""
        # Each member queued as soon as its epoch end is done: the write overlaps the next one's.
        def on_member(position: int, metrics: dict[str, float]) -> None:
            self.wait_for_runs(engine)  # the first one waits for the runs being made, if any
            self._log_member(engine, position, metrics)

        logged = engine.run_epoch(on_member=on_member)
        for position, member in enumerate(engine.members):
            record = self.records[self.running[position]]
            if position in logged or record["state"] in ENDED:
                continue
            if member.status == TrainingStatus.FAILED:
                record.update(state=TrainingStatus.FAILED.value, error=member.error)
                self.unclosed.append(position)

    def _log_member(self, engine: Engine, position: int, metrics: dict[str, float]) -> None:
        """Member ``position``'s epoch: finalized if it ended, queued for its run, recorded."""
        from workers.trial import run_constants

        member = engine.members[position]
        record = self.records[self.running[position]]
        if member.status in (TrainingStatus.FINISHED, TrainingStatus.STOPPED):  # its lone last epoch
            with self.member_rng(engine, member):
                metrics = {**metrics, **member.trainer.finalize()}
            self.unclosed.append(position)
        if self.runs[position] is not None:
            self.runs[position].log_epoch(metrics)
        self.last[position] = metrics
        history = member.trainer.history
        record.update(state=member.status, epochs=member.trainer.epoch, final={
            **_numbers(metrics), **_numbers(run_constants(member.trainer)),
            "training_iteration": float(member.trainer.epoch)},
            history={k: list(history[k]) for k in HISTORY_METRICS if k in history})

    def settle(self) -> None:
        """Wait until MLflow holds every epoch logged so far (before Tune records a checkpoint)."""
        for run in self.runs:
            if run is not None:
                run.settle()

    def close_ended(self, engine: Engine) -> None:
        self.wait_for_runs(engine)
        while self.unclosed:
            position = self.unclosed.pop(0)
            member, run = engine.members[position], self.runs[position]
            if run is not None:
                run.end(run_end(member.status, member.error))

    def stop_running(self, engine: Engine, error: BaseException | None) -> None:
        """End the runs of members still running: stopped early (Tune's stop) or failed."""
        self.wait_for_runs(engine, raising=False)
        self.close_ended(engine)
        for position, member in enumerate(engine.members):
            if member.status != TrainingStatus.RUNNING or self.records[self.running[position]]["state"] in ENDED:
                continue
            run = self.runs[position]
            if run is None:
                continue
            if error is None:
                run.end(run_end(TrainingStatus.STOPPED, stopped_early=True))
            else:
                member.status, member.error = TrainingStatus.FAILED.value, failure_text(error)
                run.end(run_end(member.status, member.error))

    def best(self) -> float:
        """The best of the members' last values of the sweep's metric (NaN: none yet)."""
        values = [r["final"].get(self.context.metric) for r in self.records]
        values = [v for v in values if v is not None and math.isfinite(v)]
        if not values:
            return math.nan
        return max(values) if self.context.mode == "max" else min(values)


def train_tune_trial(params: dict[str, Any], *, configs: TrialConfigs, context: TrialContext) -> None:
    """Tune function trainable: ``params`` a lone trial's (alpha, loss_stack, model, seed...) or a
    cohort's (``members``: each member's lone params); ``configs`` builds each member's
    configuration from them (the sweep's template and stacks, not its spec)."""
    trial = TuneTrial(params, configs, context)
    checkpoint = tune.get_checkpoint()
    behind = None
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            engine = trial.layout.restore(Path(folder))
            behind = restored_as(Path(folder))
    else:
        engine = trial.layout.fresh()
    if engine is not None:
        trial.open_runs(engine)
    if behind is not None:  # Tune restored an older checkpoint's iteration: bring it up to date
        trial.layout.catch_up(engine, behind)
    if engine is not None:
        trial.train(engine)


"""A sweep trial's MLflow runs on the trial's side: :class:`MemberRuns` makes, finds and ends them.

Every member of a Tune trial (a lone trial is a cohort of one) gets one run, which a
:class:`workers.trial.TrialRunner` writes and ends (the one rule:
:mod:`workers.tracking.run_end`). Here is what comes before and around it: the run's tags, a
leftover run of an earlier try deleted before a fresh start (no trial ever has two runs), the
run a checkpoint names attached on a resume, and how a run that ended before a kill ended.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from mlflow.tracking import MlflowClient

from workers.contract import (
    RUN_KIND_TAG,
    RUN_KIND_TRIAL,
    SWEEP_ID_TAG,
    TAG_PREFIX,
    TRIAL_ID_TAG,
    TrainingStatus,
    runs_with_tag_filter,
)
from workers.tracking.retry import retrying
from workers.tracking.run_end import end_run_by_id, run_end, was_stopped_early
from workers.tracking.runs import NewRun, ensure_experiment
from workers.tracking.writer import create_run_later

if TYPE_CHECKING:  # the training stack is imported where a trial runs: the driver never loads torch
    from sweeps.tune.trial_context import TrialContext
    from workers.train import Trainer
    from workers.trial import TrialRunner

__all__ = ["COHORT_TAG", "MemberRuns", "member_trial_id", "param_tag"]

COHORT_TAG = "ksweep.cohort"
"""On a trial run trained in a cohort: the Tune trial id of its cohort (absent for a lone trial)."""


def member_trial_id(cohort_trial_id: str, position: int) -> str:
    """The trial id of member ``position`` of the cohort that Tune runs as ``cohort_trial_id``."""
    return f"{cohort_trial_id}-m{position}"


def param_tag(name: str) -> str:
    """The run tag mirroring a trial's search param (``ksweep.alpha``...)."""
    return f"{TAG_PREFIX}{name}"


class MemberRuns:
    """The MLflow runs of one Tune trial's members, in the sweep's experiment (``context``)."""

    def __init__(self, context: TrialContext) -> None:
        self.context = context
        self.client = MlflowClient(tracking_uri=context.tracking_uri)

    def delete_leftovers(self, tags: dict[str, str], trial_ids: set[str] | None = None) -> None:
        """Delete the sweep's runs carrying ``tags`` (one search), only those of ``trial_ids``
        when given: the runs a trial started before its last failure, with no checkpoint."""
        client = self.client
        experiment_id = ensure_experiment(client, self.context.experiment_name)
        stale_filter = runs_with_tag_filter(**{SWEEP_ID_TAG: self.context.sweep_id, **tags})
        stale_runs = retrying(lambda: client.search_runs([experiment_id], filter_string=stale_filter),
                              f"search for leftover runs of {tags}")
        for run_id in [stale.info.run_id for stale in stale_runs
                       if trial_ids is None or stale.data.tags.get(TRIAL_ID_TAG) in trial_ids]:
            retrying(lambda run_id=run_id: client.delete_run(run_id), f"delete leftover run {run_id}",
                     done=lambda run_id=run_id: client.get_run(run_id).info.lifecycle_stage == "deleted")

    def new_run(self, trainer: Trainer, params: dict[str, Any], trial_id: str,
                extra_tags: dict[str, str] | None = None) -> NewRun:
        """A member's new run: its tags (sweep, trial, kind, one per search param) and params."""
        from workers.trial import TrialRunner

        context = self.context
        tags = {SWEEP_ID_TAG: context.sweep_id, TRIAL_ID_TAG: trial_id, RUN_KIND_TAG: RUN_KIND_TRIAL,
                **{param_tag(k): v for k, v in params.items()}, **(extra_tags or {})}
        return TrialRunner.new_run(trainer, context.tracking_uri, context.experiment_name,
                                   trainer.config.name or trial_id, tags, context.parent_run_id)

    def created(self, trainer: Trainer, run_id: str, experiment_id: str) -> TrialRunner:
        """The runner of a member's run once :meth:`new_run` is created."""
        from workers.trial import TrialRunner

        return TrialRunner.created(trainer, self.context.tracking_uri, run_id, experiment_id,
                                   **self._options())

    def make_later(self, trainer: Trainer, params: dict[str, Any], trial_id: str,
                   extra_tags: dict[str, str] | None = None) -> Future[tuple[str, str]]:
        """Have the metric writer make a fresh member's run (:meth:`new_run`) while the first
        epoch trains; the future's result is (run id, experiment id). Its caller deleted any
        leftover run of the member first (:meth:`delete_leftovers`)."""
        return create_run_later(self.new_run(trainer, params, trial_id, extra_tags))

    def attach(self, trainer: Trainer, run_id: str) -> TrialRunner:
        """The run a checkpoint names, for a member resumed from it (the epochs it holds and the
        run lacks are logged first: :meth:`TrialRunner.attach`)."""
        from workers.trial import TrialRunner

        return TrialRunner.attach(trainer, self.context.tracking_uri, run_id, **self._options())

    def _options(self) -> dict[str, bool]:
        """How a sweep's member run logs: deferred epochs (settled before each ``tune.report``),
        PNGs only with ``tracking.trial_plots``."""
        return {"plots": self.context.trial_plots, "deferred": True}

    def ended_as(self, run_id: str) -> str | None:
        """How run ``run_id`` ended when it ended FINISHED: stopped (early, from outside) or
        finished (a :class:`~workers.contract.TrainingStatus` value); None when it did not."""
        run = retrying(lambda: self.client.get_run(run_id), f"get run {run_id}")
        if run.info.status != "FINISHED":
            return None
        stopped = was_stopped_early(run.data.tags)
        return (TrainingStatus.STOPPED if stopped else TrainingStatus.FINISHED).value

    def is_running(self, run_id: str) -> bool:
        return self.client.get_run(run_id).info.status == "RUNNING"

    def close_leftover(self, record: dict[str, Any]) -> None:
        """A member that ended before a kill, whose run the kill left RUNNING: end it now."""
        if record.get("run_id") and self.is_running(record["run_id"]):
            end_run_by_id(self.client, record["run_id"], run_end(record["state"], record.get("error")))

"""A cohort whose members each keep their own MLflow run: the cohort's ``run_logged_trial``.

Every member gets a :class:`~workers.trial.TrialRunner` (its params, one metric point per epoch
through one ``log_batch`` call, its PNGs when asked, its end state), so in MLflow and in the service a
member is indistinguishable from a lone trial: its run ends by the one rule of
:mod:`workers.tracking.run_end`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workers.cohort.chunked import open_cohort
from workers.cohort.member import Member, MemberCallback
from workers.contract import TrainingStatus, failure_text
from workers.tracking.run_end import run_end
from workers.train.config import TrialConfig
from workers.trial import TrialRunner, default_run_name


def finish_member_run(member: Member, run: TrialRunner) -> None:
    """End a member's run by the one rule (:meth:`TrialRunner.end`): stopped early when the
    cohort took it out before its budget (:meth:`Cohort.stop`, ``patience``), not when its own
    early stopping ended it (as a lone trial's run)."""
    outside = (member.status == TrainingStatus.STOPPED and not member.trainer.selection.stopped
               and member.trainer.epoch < member.config.training.epochs)
    run.end(run_end(member.status, member.error, stopped_early=outside))


def run_logged_cohort(
    configs: Sequence[TrialConfig],
    tracking_uri: str,
    experiment_name: str,
    cache_root: Path | str,
    *,
    tags: Sequence[Mapping[str, Any]] | None = None,
    parent_run_id: str | None = None,
    on_epoch: MemberCallback | None = None,
    patience: int | None = None,
    checkpoints: Mapping[int, Path | str] | None = None,
    run_ids: Mapping[int, str] | None = None,
    plots: bool = True,
) -> list[tuple[Member, TrialRunner]]:
    """Train ``configs`` as one cohort, each member logged as its own (child) run.

    ``tags[i]``: member i's run tags (e.g. its Tune trial id). ``checkpoints[i]`` and
    ``run_ids[i]`` resume member i from its checkpoint into its existing run. ``on_epoch`` runs
    after each member's epoch is logged (report, checkpoint); a truthy return stops the member.
    ``plots``: each member's five PNGs, as ``run_logged_trial``'s.
    """
    cohort = open_cohort(configs, cache_root, checkpoints)  # in memory-sized chunks where it must
    runs = []
    for member in cohort.members:
        position = member.position
        if run_ids and run_ids.get(position):
            runs.append(TrialRunner.attach(member.trainer, tracking_uri, run_ids[position],
                                        plots=plots))
        else:
            runs.append(TrialRunner.start(member.trainer, tracking_uri, experiment_name,
                                       default_run_name(member.config),
                                       tags[position] if tags else None, parent_run_id,
                                       plots=plots))

    def log(member: Member, epoch: int, metrics: dict[str, float]) -> object:
        runs[member.position].log_epoch(metrics)
        return on_epoch(member, epoch, metrics) if on_epoch is not None else None

    try:
        cohort.run(on_epoch=log, patience=patience)
    except BaseException as error:  # the cohort itself broke: no member's run stays RUNNING
        for member, run in zip(cohort.members, runs, strict=True):
            if member.status == TrainingStatus.RUNNING:
                member.status, member.error = TrainingStatus.FAILED.value, failure_text(error)
            finish_member_run(member, run)
        raise
    for member, run in zip(cohort.members, runs, strict=True):
        finish_member_run(member, run)
    return list(zip(cohort.members, runs, strict=True))

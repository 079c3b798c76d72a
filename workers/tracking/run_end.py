"""How a trial's MLflow run ends: the one rule for its status and tags (:func:`run_end`).

A trial run (a lone trial's or a cohort member's) ends in one of three ways, whoever ends it
(the trial's own process through :meth:`workers.trial.TrialRunner.end`, or the driver closing a
run a killed trial left ``RUNNING``, through :func:`end_run_by_id`):

- ``FINISHED``: it trained to its budget or stopped on its own early stopping;
- ``FINISHED`` with ``ksweep.stopped_early = true``: something outside the trial stopped it
  before its budget (a scheduler such as ASHA, a time budget, a cohort's ``stop``);
- ``FAILED`` with ``ksweep.failure``: the reason (``Type: message`` for an exception), cut to
  :data:`~workers.contract.MAX_ERROR_CHARS`; ``failed`` when no reason is known.

Torch-free: the driver imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mlflow.tracking import MlflowClient

from workers.contract import (
    FAILURE_TAG,
    MAX_ERROR_CHARS,
    STOPPED_EARLY_TAG,
    TrainingStatus,
    failure_text,
)

__all__ = ["RunEnd", "end_run_by_id", "run_end", "was_stopped_early"]


@dataclass(frozen=True)
class RunEnd:
    """A run's end: MLflow's status and the tags set just before it."""

    status: str
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def stopped_early(self) -> bool:
        return was_stopped_early(self.tags)


def was_stopped_early(tags: Mapping[str, str]) -> bool:
    """Whether a run's tags say something outside its trial stopped it (the rule's reading)."""
    return tags.get(STOPPED_EARLY_TAG) == "true"


def run_end(state: TrainingStatus | str, error: BaseException | str | None = None, *,
            stopped_early: bool = False) -> RunEnd:
    """The end of a run whose trial ended in ``state`` (a :class:`TrainingStatus`).

    Args:
        state: ``failed`` ends the run FAILED; any other state ends it FINISHED.
        error: the failure's reason, an exception (written ``Type: message``) or its text.
        stopped_early: stopped from outside the trial before its budget (the module doc).
    """
    if state == TrainingStatus.FAILED:
        reason = failure_text(error) if isinstance(error, BaseException) else error
        return RunEnd("FAILED", {FAILURE_TAG: (reason or TrainingStatus.FAILED.value)[:MAX_ERROR_CHARS]})
    return RunEnd("FINISHED", {STOPPED_EARLY_TAG: "true"} if stopped_early else {})


def end_run_by_id(client: MlflowClient, run_id: str, end: RunEnd) -> None:
    """End run ``run_id`` as ``end`` says, through ``client``: for a run whose trial is gone.
    Not retried: its callers (the driver's backstop, a restored cohort) treat a failure as
    their own."""
    for key, value in end.tags.items():
        client.set_tag(run_id, key, value)
    client.set_terminated(run_id, end.status)

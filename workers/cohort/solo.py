"""A cohort of one on its lone :class:`~workers.train.Trainer`: :class:`SoloCohort`.

A sweep's Tune trial trains K >= 1 members through one interface (``members``, ``active``,
``run_epoch``, ``save_checkpoint``, ``member_rng``). K > 1 stacks them
(:class:`workers.cohort.trainer.Cohort`); K = 1 needs no stacking, so its member trains on its
lone trainer, step for step as ``ksweep train`` trains it, at a lone trial's cost. An error in
training is not caught here (a cohort fails only the member): it ends the trial, as it ends a
lone trial, and Tune retries it from its last checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from workers.contract import TrainingStatus
from workers.train import Trainer
from workers.train.config import TrialConfig


@dataclass
class SoloMember:
    """The one member: its trainer and its status (a :class:`TrainingStatus` value)."""

    trainer: Trainer
    position: int = 0
    status: str = TrainingStatus.RUNNING.value
    error: str | None = None

    @property
    def config(self) -> TrialConfig:
        return self.trainer.config

    def update_status(self) -> None:
        """Finished at its budget, stopped by its own early stopping, else running."""
        if self.trainer.epoch >= self.config.training.epochs:
            self.status = TrainingStatus.FINISHED.value
        elif self.trainer.finished:
            self.status = TrainingStatus.STOPPED.value


class SoloCohort:
    """One trainer with a cohort's interface (the module doc)."""

    def __init__(self, trainer: Trainer) -> None:
        member = SoloMember(trainer)
        member.update_status()  # a trainer restored from its last epoch's checkpoint has ended
        self.members = [member]

    @property
    def active(self) -> list[SoloMember]:
        return [m for m in self.members if m.status == TrainingStatus.RUNNING]

    @property
    def epoch(self) -> int:
        return self.members[0].trainer.epoch

    def run_epoch(self, on_member: Callable[[int, dict[str, float]], None] | None = None
                  ) -> dict[int, dict[str, float]]:
        """One epoch of the trainer; ``on_member(0, metrics)`` after it (as a cohort's)."""
        member = self.members[0]
        metrics = member.trainer.run_epoch()
        member.update_status()
        if on_member is not None:
            on_member(0, metrics)
        return {0: metrics}

    def save_checkpoint(self, member: SoloMember, path: Path | str) -> Path:
        return member.trainer.save_checkpoint(path)

    @staticmethod
    @contextlib.contextmanager
    def member_rng(member: SoloMember) -> Iterator[None]:
        """The process's RNG is the trainer's own: nothing to swap (a cohort swaps each
        member's streams in, :func:`workers.cohort.member.own_rng`)."""
        yield

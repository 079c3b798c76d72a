"""A cohort opened for its device: one :class:`Cohort`, or memory-sized chunks trained in turn.

:func:`open_cohort` is how a worker builds the cohort it trains (a sweep's cohort trial,
:func:`run_cohort`, ``run_logged_cohort``): it builds the members' lone trainers, plans the
chunks for the device's free memory (:func:`workers.cohort.memory.plan_chunks`) and, when one
chunk holds them all, returns the plain cohort. Otherwise a :class:`ChunkedCohort` runs every
epoch chunk by chunk, so a sweep still reports each epoch for all its members; only one
chunk's activations are alive at a time. Members never interact, so each gets the numbers it
gets in the whole cohort.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from workers.cohort.member import Member, MemberCallback
from workers.cohort.memory import plan_chunks
from workers.cohort.trainer import Cohort
from workers.contract import VAL_LOSS, TrainingStatus
from workers.train.config import TrialConfig


class ChunkedCohort:
    """Several cohorts of one shape trained as one: the same members, epoch and API as a
    :class:`Cohort` (``members``, ``active``, ``epoch``, :meth:`run_epoch`, :meth:`stop`,
    :meth:`run`, :meth:`save_checkpoint`)."""

    def __init__(self, chunks: list[Cohort]) -> None:
        self.chunks = chunks
        self.members: list[Member] = [m for chunk in chunks for m in chunk.members]
        self._chunk_of = {id(m): chunk for chunk in chunks for m in chunk.members}

    @property
    def active(self) -> list[Member]:
        return [m for chunk in self.chunks for m in chunk.active]

    @property
    def epoch(self) -> int:
        return min(chunk.epoch for chunk in self.chunks)

    def run_epoch(self, patience: int | None = None, monitor: str = VAL_LOSS,
                  on_member: Callable[[int, dict[str, float]], None] | None = None) -> dict[int, dict[str, float]]:
        """One epoch of every chunk with running members, in turn; metrics by member position
        (``on_member``: as :meth:`Cohort.run_epoch`)."""
        results: dict[int, dict[str, float]] = {}
        for chunk in self.chunks:
            if chunk.active:
                results.update(chunk.run_epoch(patience, monitor, on_member))
        return results

    def stop(self, member: Member, reason: str = TrainingStatus.STOPPED.value) -> None:
        self._chunk_of[id(member)].stop(member, reason)

    def run(self, on_epoch: MemberCallback | None = None, patience: int | None = None,
            monitor: str = VAL_LOSS) -> list[Member]:
        """Each chunk to its end, one after another (as :meth:`Cohort.run`); returns the members."""
        for chunk in self.chunks:
            chunk.run(on_epoch=on_epoch, patience=patience, monitor=monitor)
        return self.members

    def save_checkpoint(self, member: Member, path: Path | str) -> Path:
        return self._chunk_of[id(member)].save_checkpoint(member, path)


def open_cohort(configs: Sequence[TrialConfig], cache_root: Path | str = ".ksweep",
                checkpoints: Mapping[int, Path | str] | None = None,
                free: int | None = None) -> Cohort | ChunkedCohort:
    """The cohort of ``configs`` for its device (resumed from ``checkpoints[i]`` if given).

    ``free``: bytes to plan for (None: :func:`workers.cohort.memory.free_bytes`). Chunking is
    logged (WARNING) with the members, the MiB per member and the free MiB.
    """
    members = Cohort.create_members(configs, cache_root, checkpoints)
    chunks = plan_chunks([m.trainer for m in members], free)
    if len(chunks) == 1:
        return Cohort.from_members(members, cache_root)
    return ChunkedCohort([Cohort.from_members([members[i] for i in chunk], cache_root) for chunk in chunks])


def run_cohort(configs: Sequence[TrialConfig], cache_root: Path | str = ".ksweep", *,
               on_epoch: MemberCallback | None = None, patience: int | None = None,
               checkpoints: Mapping[int, Path | str] | None = None, free: int | None = None) -> list[Member]:
    """Train ``configs`` as one cohort; per member: ``trainer`` (history, checkpoints), ``status``, ``error``.

    When the device's free memory (``free`` bytes, None: measured) cannot hold the whole
    cohort's step, it trains in memory-sized chunks one after another (logged): every member's
    numbers are those of the whole cohort.
    """
    return open_cohort(configs, cache_root, checkpoints, free).run(on_epoch=on_epoch, patience=patience)

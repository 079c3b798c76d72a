"""Schedules over a trial's optimizer steps: the KL weight's annealing factor, and run-relative lengths.

A schedule's length is given in optimizer steps, or relative to the trial's run (a fraction
of its total optimizer steps, a number of cycles). The total is ``epochs x ceil(train rows /
batch_size)``: the trainers take one step per batch, the last batch of an epoch smaller,
and pass the 0-based step to the loss stack and the model. The trainer resolves the lengths
with its total; the planner computes the same total to print it and to say which schedules
do not finish within the run (:func:`ramp_overrun`, :func:`kl_schedule_overrun`).
Torch-free.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from objectives.options import DEFAULT_CYCLE_STEPS, DEFAULT_WARMUP_STEPS

if TYPE_CHECKING:
    from objectives.options import KLOptions

__all__ = [
    "cycle_length",
    "fraction_of_run",
    "kl_anneal_factor",
    "kl_schedule_overrun",
    "ramp_overrun",
    "steps_per_epoch",
    "total_optimizer_steps",
    "warmup_length",
]



def steps_per_epoch(train_rows: int, batch_size: int) -> int:
    """Optimizer steps in one pass over ``train_rows`` examples: ``ceil(rows / batch_size)``."""
    if train_rows < 1 or batch_size < 1:
        raise ValueError(f"train_rows and batch_size must be >= 1, got {train_rows} and {batch_size}")
    return -(-train_rows // batch_size)


def total_optimizer_steps(epochs: int, train_rows: int, batch_size: int) -> int:
    """A trial's whole budget in optimizer steps: ``epochs x ceil(train_rows / batch_size)``."""
    return epochs * steps_per_epoch(train_rows, batch_size)


def fraction_of_run(fraction: float, total_steps: int | None, field: str) -> int:
    """``fraction`` of ``total_steps``, rounded to the nearest step (halves up), at least 1.

    Raises:
        ValueError: ``total_steps`` is None (``field`` is named: it is relative to the run).
    """
    if total_steps is None:
        raise ValueError(f"{field} is relative to the trial's run: it needs the run's total "
                         "optimizer steps (build the stack with total_steps=...)")
    return max(1, math.floor(fraction * total_steps + 0.5))


def warmup_length(options: KLOptions, total_steps: int | None = None) -> int:
    """The linear ramp's length in steps: ``warmup_steps``, ``warmup_fraction`` of the run, or
    the default."""
    if options.warmup_fraction is not None:
        return fraction_of_run(options.warmup_fraction, total_steps, "warmup_fraction")
    return options.warmup_steps if options.warmup_steps is not None else DEFAULT_WARMUP_STEPS


def cycle_length(options: KLOptions, total_steps: int | None = None) -> float:
    """One cyclical period in steps: ``cycle_steps``, the run / ``cycles`` (not rounded), or the
    default."""
    if options.cycles is not None:
        if total_steps is None:
            raise ValueError("cycles is relative to the trial's run: it needs the run's total "
                             "optimizer steps (build the stack with total_steps=...)")
        return total_steps / options.cycles
    return float(options.cycle_steps if options.cycle_steps is not None else DEFAULT_CYCLE_STEPS)


def kl_anneal_factor(options: KLOptions, step: int, total_steps: int | None = None) -> float:
    """The schedule factor in [anneal_start, 1] that multiplies beta at ``step`` (0-based).

    ``total_steps`` (the run's) is needed only by the run-relative lengths.
    """
    if options.anneal == "none":
        return 1.0
    if options.anneal == "linear":
        progress = min(1.0, max(0, step) / warmup_length(options, total_steps))
    else:
        cycle = cycle_length(options, total_steps)
        position = (max(0, step) % cycle) / cycle
        progress = min(1.0, position / options.cycle_ratio)
    return options.anneal_start + (1.0 - options.anneal_start) * progress


def ramp_overrun(what: str, length: float, total_steps: int) -> str | None:
    """``"{what} of {length} steps"`` when a ramp reaching its end at step ``length`` is still
    ramping at the run's last step (``total_steps - 1``); None when it finishes."""
    if length <= total_steps - 1:
        return None
    return f"{what} of {length:g} steps"


def kl_schedule_overrun(options: KLOptions, total_steps: int) -> str | None:
    """Why the KL annealing does not finish within a run of ``total_steps`` steps, in words;
    None when it does (or there is none).

    A linear warm-up finishes when beta is at its full weight by the last step. A cyclical
    schedule finishes when at least one whole cycle fits and the run does not end inside a
    ramp (its last step trains at the full weight).
    """
    if options.anneal == "none":
        return None
    if options.anneal == "linear":
        return ramp_overrun("KL warm-up", warmup_length(options, total_steps), total_steps)
    cycle = cycle_length(options, total_steps)
    if cycle > total_steps:
        return f"KL cycles of {cycle:g} steps (not one whole cycle)"
    if kl_anneal_factor(options, total_steps - 1, total_steps) < 1.0:
        return f"KL cycles of {cycle:g} steps (the run ends inside a ramp)"
    return None

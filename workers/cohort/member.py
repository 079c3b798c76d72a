"""A cohort member: a lone Trainer plus its own RNG streams and status (see cohort.py)."""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from workers.cohort.grouping import cohort_key, cohort_problem
from workers.contract import PERF_EPOCH_SECONDS, PERF_TOKENS_PER_SECOND, TrainingStatus
from workers.models.config import ModelConfig
from workers.train import phases as train_phases
from workers.train.batch_metrics import kl_multiplier_metrics
from workers.train.config import TrialConfig
from workers.train.loop import Trainer

OUTPUTS = ("token_nll", "kl", "bow_logits")  # the forward's outputs every loss stack may read
POSTERIOR_PROBS = "posterior_probs"  # a discrete latent's q, read by the KL's mutual_info_credit


def loss_outputs(config: ModelConfig) -> tuple[str, ...]:
    """The forward's outputs a loss stack may read (and backpropagate through) under ``config``."""
    return (*OUTPUTS, POSTERIOR_PROBS) if config.family == "discrete" else OUTPUTS


@dataclass
class Member:
    """One trial of a cohort. ``status``: a :class:`~workers.contract.TrainingStatus` value."""

    position: int  # index in the configs the cohort was made from
    trainer: Trainer
    generator: torch.Generator  # the stream of the forward's noise (the lone trial's torch RNG)
    host_rng: tuple  # (python, numpy, torch CPU) states, swapped in around its evaluation
    status: str = TrainingStatus.RUNNING.value
    error: str | None = None
    step_losses: list[float] = field(default_factory=list)  # every step's training loss
    best: float = math.inf
    since_best: int = 0

    @property
    def config(self) -> TrialConfig:
        return self.trainer.config


MemberCallback = Callable[[Member, int, dict[str, float]], object]


def capture(position: int, trainer: Trainer) -> Member:
    """Freeze the RNG streams a lone run of ``trainer`` would go on with."""
    cpu = torch.get_rng_state()
    if trainer.device.type == "cpu":
        generator = torch.Generator()
        generator.set_state(cpu)
    else:  # the lone run's CUDA stream is fresh after seed_everything (init happens on CPU)
        generator = torch.Generator(trainer.device).manual_seed(trainer.config.seed)
    return Member(position, trainer, generator, (random.getstate(), np.random.get_state(), cpu))


@contextlib.contextmanager
def own_rng(member: Member):
    """Run with the member's host RNG states as the global ones (its lone run's), then save them."""
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    python, numpy_state, cpu = member.host_rng
    on_cpu = member.trainer.device.type == "cpu"
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(member.generator.get_state() if on_cpu else cpu)
    try:
        yield
    finally:
        cpu = torch.get_rng_state()
        if on_cpu:
            member.generator.set_state(cpu)
        member.host_rng = (random.getstate(), np.random.get_state(), cpu)
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


def check_cohort(configs: Sequence[TrialConfig]) -> None:
    """Raise ValueError unless ``configs`` may train as one cohort."""
    if not configs:
        raise ValueError("a cohort needs at least one trial config")
    problems = [cohort_problem(c) for c in configs] if len(configs) > 1 else []
    for index, problem in enumerate(problems):
        if problem:
            raise ValueError(f"cohort member {index}: {problem}")
    first = cohort_key(configs[0])
    for index, config in enumerate(configs[1:], start=1):
        if cohort_key(config) != first:
            raise ValueError(
                f"cohort member {index} differs from member 0 in a shape or budget field (data "
                "except seed, base, model, or training besides learning_rate, weight_decay, "
                "grad_clip); group trials with workers.cohort.grouping.group_cohorts"
            )


def per_member(active, groups, sums, counts, losses, terms):
    """Group-stacked epoch tensors -> member k's sums, count, step losses and step terms."""
    result = [None] * len(active)
    for g, (_, positions, _) in enumerate(groups):
        step_losses = torch.stack(losses[g], dim=1)
        step_terms = {key: torch.stack([t[key] for t in terms[g]], dim=1) for key in terms[g][0]}
        for j, k in enumerate(positions):
            result[k] = ({key: v[j] for key, v in sums[g].items()}, counts[g][j], step_losses[j],
                         {key: v[j] for key, v in step_terms.items()})
    return [list(column) for column in zip(*result, strict=True)]


def train_metrics(member: Member, sums: dict[str, torch.Tensor], count: torch.Tensor, elapsed: float,
                  cohort_size: int, step: int) -> dict[str, float]:
    """The member's train metrics of an epoch, as its lone ``train_epoch`` returns them: the
    running means of its steps (``sums / count``), its kappa summaries, its KL multiplier and the
    epoch's speed (``elapsed``: the cohort's train pass). A logging point: host syncs."""
    trainer = member.trainer
    count_value = max(1, int(count))
    train = {f"train/{key}": float(v) / count_value for key, v in sums.items()}
    train.update({f"train/{key}": v for key, v in trainer.kappa_metrics["train"].items()})
    schedule = train_phases.training_stack(trainer.build_stack(member.config.loss_stack),
                                           member.config.training, len(trainer.train_data.split))
    train.update(kl_multiplier_metrics(trainer.rate_control, schedule, step))
    train[PERF_EPOCH_SECONDS] = elapsed
    train[PERF_TOKENS_PER_SECOND] = int(trainer.train_data.split.mask.sum()) / elapsed
    train["perf/cohort_size"] = float(cohort_size)
    return train

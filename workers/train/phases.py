"""Training phases that remedy posterior collapse: how a trial trains, not what it optimises.

Autoencoder pre-training (Li et al. 2019: the KL weight at 0 for the first epochs, optionally
resetting the decoder after) and aggressive inference-network updates (He et al. 2019: the
inference network updated alone for a few batches before each generative update). The lone
trainer and the cohort take their plan from here, so a member updates what it would alone.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from objectives.stack import LossStack
from workers.models.cvae import CVAE, INFERENCE_PARAMS
from workers.train.config import TrainingConfig, TrialConfig

Part = Literal["all", "encoder", "decoder"]
"""Which parameters an update moves: all, the inference network only, or all but it."""

DECODER_PREFIX = "decoder."  # what autoencoder_reset_decoder resets (the shared embedding stays)


def steps_per_epoch(rows: int, batch_size: int) -> int:
    """Counted optimisation steps in one epoch (encoder-only updates are not counted)."""
    return math.ceil(rows / batch_size)


def update_plan(batches: int, training: TrainingConfig, epoch: int) -> list[tuple[int, Part]]:
    """Epoch ``epoch``'s (0-based) updates in order, as (batch index, part).

    One ``all`` update per batch; in an aggressive epoch, batch i's ``decoder`` update comes
    after ``aggressive_encoder_steps`` ``encoder`` updates on batches i+1, i+2, ... (wrapping
    round): the encoder sees other examples, as He et al.'s inner loop samples fresh ones,
    and no random draw is added to the batching stream.
    """
    if epoch >= training.aggressive_epochs:
        return [(index, "all") for index in range(batches)]
    plan: list[tuple[int, Part]] = []
    for index in range(batches):
        plan.extend(((index + j) % batches, "encoder") for j in range(1, training.aggressive_encoder_steps + 1))
        plan.append((index, "decoder"))
    return plan


def in_part(name: str, part: Part) -> bool:
    """Whether an update of ``part`` moves the parameter called ``name``."""
    return part == "all" or (part == "encoder") == name.startswith(INFERENCE_PARAMS)


def counted(part: Part) -> bool:
    """Whether an update advances the step counter (schedules, logged losses): every one but
    an encoder-only update, so an epoch has the same steps with or without aggressive updates."""
    return part != "encoder"


class PretrainingStack(LossStack):
    """A loss stack whose KL weight is 0 before step ``kl_from_step`` and follows the stack's own
    schedule, counted from ``kl_from_step``, after it (the other terms are as built)."""

    def __init__(self, stack: LossStack, kl_from_step: int) -> None:
        self.__dict__.update(stack.__dict__)  # the built stack as it is, its reference scales included
        self.kl_from_step = kl_from_step

    def weights_at(self, step: int) -> dict[str, float]:
        weights = super().weights_at(step)
        if "kl" in weights:
            weights["kl"] = 0.0 if step < self.kl_from_step else super().weights_at(step - self.kl_from_step)["kl"]
        return weights


def training_stack(stack, training: TrainingConfig, rows: int):
    """The stack a train step uses: ``stack``, or with autoencoder pre-training its
    :class:`PretrainingStack` (``rows``: the train split's size)."""
    if training.autoencoder_epochs == 0:
        return stack
    return PretrainingStack(stack, training.autoencoder_epochs * steps_per_epoch(rows, training.batch_size))


def resets_decoder(training: TrainingConfig, epoch: int) -> bool:
    """Whether epoch ``epoch``'s (0-based) train pass starts by resetting the decoder."""
    return training.autoencoder_reset_decoder and 0 < training.autoencoder_epochs == epoch


def initial_decoder(config: TrialConfig, vocab_size: int, num_strategies: int) -> dict[str, torch.Tensor]:
    """The decoder's parameters as the trial initialised them (CPU): the model is rebuilt from
    the trial seed, as ``Trainer.create`` builds it, without touching the global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = CVAE(config.model, vocab_size, num_strategies)
    return {name: param.detach() for name, param in model.named_parameters() if name.startswith(DECODER_PREFIX)}


def start_epoch(trainer, epoch: int) -> dict[Part, list[torch.nn.Parameter]]:
    """A lone trainer's epoch start (0-based ``epoch``): the decoder reset when the KL comes in
    (:func:`resets_decoder`); returns the parameters an ``encoder`` and a ``decoder`` update move."""
    if resets_decoder(trainer.config.training, epoch):
        view = trainer.view
        reset_decoder(trainer.model, trainer.optimizer,
                      initial_decoder(trainer.config, view.vocab_size, view.num_strategies))
    named = list(trainer.model.named_parameters())
    return {part: [param for name, param in named if in_part(name, part)] for part in ("encoder", "decoder")}


def reset_decoder(model: torch.nn.Module, optimizer, initial: dict[str, torch.Tensor]) -> None:
    """Copy ``initial`` into ``model``'s decoder parameters and drop their AdamW state."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in initial:
                param.copy_(initial[name])
                optimizer.state.pop(param, None)

"""A cohort's random draws and training phases, on its stacked parameters.

Each member's draws come from its own stream in its lone forward's order: the word
dropout's mask first, then z's noise (workers/models/cvae.py). The phases are the lone
trainer's (workers/train/phases.py): a member's encoder-only update moves only its slices of
the inference network's parameters, and the decoder reset writes each member's initial
decoder into its slices and clears its AdamW state there.
"""

from __future__ import annotations

import torch

from workers.models.backbone import upcast, word_dropout_mask
from workers.train import phases

Draws = tuple[torch.Tensor | None, torch.Tensor | None]
"""``(noise, dropped)``: z's noise ``[K, B, ...]`` and the word dropout's ``[K, B, T]`` (None: none)."""


def member_draws(cohort, generators: list[torch.Generator], batch: int) -> Draws:
    """Each member's draws for a batch of ``batch`` rows, from its own stream, as alone."""
    config, device = cohort.model_config, cohort.device
    dropped = None
    if config.word_dropout > 0:  # per generator, the mask is drawn before the noise
        shape = (batch, cohort.train_tensors["decoder_input"].shape[-1])
        dropped = torch.stack([word_dropout_mask(shape, config.word_dropout, device, g) for g in generators])
    dtype = upcast(next(iter(cohort.params.values()))).dtype
    if cohort.members[0].config.training.bf16 and device.type == "cuda":
        dtype = torch.float32
    noise = None
    if config.family == "continuous":
        noise = torch.stack([torch.randn((batch, config.latent_dim), dtype=dtype, device=device,
                                         generator=g) for g in generators])
    elif config.discrete_estimator == "gumbel":
        noise = torch.stack([-torch.empty((batch, cohort.num_categories), dtype=dtype, device=device)
                             .exponential_(generator=g).log() for g in generators])
    return noise, dropped


def part_names(names, part: phases.Part) -> list[str] | None:
    """The parameter names an update of ``part`` moves (None: all of them)."""
    return None if part == "all" else [name for name in names if phases.in_part(name, part)]


def reset_decoders(cohort, members) -> None:
    """At the epoch where the KL comes in: each member's decoder reset, alone and in the stack."""
    for member in members:
        trainer = member.trainer
        initial = phases.initial_decoder(trainer.config, trainer.view.vocab_size, trainer.view.num_strategies)
        phases.reset_decoder(trainer.model, trainer.optimizer, initial)
        row = cohort.rows.index(member)
        with torch.no_grad():
            for name, value in initial.items():
                cohort.params[name][row] = value.to(cohort.params[name].dtype)
                cohort.optimizer.reset_member(name, row)

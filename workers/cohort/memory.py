"""Cohorts bigger than the device's free memory: trained in memory-sized chunks, one after another.

Members never interact (workers/cohort/trainer.py), so a cohort of K trained as chunks of
M <= K members gives every member the numbers it gets in the whole cohort. The plan stays
machine-independent (``cohort_size`` is not touched); only the worker that runs the cohort
looks at its device: on CUDA the free memory (``torch.cuda.mem_get_info``), on the CPU none
(no chunking: host memory is not what limits these sizes); both capped by
``KSWEEP_COHORT_MEMORY_MIB`` where it is set. :mod:`workers.cohort.chunked` trains the chunks.
"""

from __future__ import annotations

import logging
import math

import torch

from workers.settings import worker_settings

log = logging.getLogger(__name__)

HEADROOM = 0.8  # the share of the free memory a chunk may plan to use (allocator slack, eval batches)
ACTIVATION_FACTOR = 10  # floats a GRU keeps per hidden unit per position and layer (gates, states, grads)


def member_step_bytes(trainer) -> int:
    """An estimate of one member's memory in a training step: parameters, gradients, AdamW's
    two moments, and the activations of one batch kept for the backward.

    ``trainer``: the member's lone :class:`~workers.train.loop.Trainer`. Activations: each GRU
    position keeps about ``ACTIVATION_FACTOR`` x hidden values per layer (encoders over
    context and target, the decoder once per enumerated category), the decoder's logits three
    vocabulary-wide float32 rows per token (logits, log-softmax, gradient). bf16 autocast on
    CUDA halves the GRU activations. An estimate: chunks plan with :data:`HEADROOM`.
    """
    model, config = trainer.model, trainer.config
    element = next(model.parameters()).element_size()
    params = sum(p.numel() for p in model.parameters()) * element * 4
    split = trainer.train_data.split
    context, target = split.context.shape[-1], split.target.shape[-1]
    batch, hidden, layers = config.training.batch_size, model.config.hidden_dim, model.config.num_layers
    repeats = model.num_categories if model.family == "discrete" and model.config.discrete_estimator == "enumerate" else 1
    vocab = model.embedding.num_embeddings
    gru_element = 2 if config.training.bf16 and trainer.device.type == "cuda" else element
    gru = batch * (context + target * (1 + repeats)) * layers * hidden * ACTIVATION_FACTOR * gru_element
    logits = batch * repeats * target * vocab * 3 * 4
    return int(params + gru + logits)


def free_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` in bytes (CUDA), or None where it does not limit a cohort (CPU);
    at most ``KSWEEP_COHORT_MEMORY_MIB`` MiB where that is set (on the CPU too)."""
    measured = int(torch.cuda.mem_get_info(device)[0]) if device.type == "cuda" else None
    mib = worker_settings().cohort_memory_mib  # a GPU shared with other work, or a CPU limit
    if mib is None:
        return measured
    capped = int(mib * 2**20)
    return capped if measured is None else min(measured, capped)


def chunk_sizes(members: int, per_member: int, free: int | None, headroom: float = HEADROOM) -> list[int]:
    """Sizes of the chunks ``members`` train in: one chunk when ``free`` is None or all fit.

    Chunks are as even as possible (e.g. 10 members, room for 4: 4, 3, 3); when not even one
    member fits the planned share, chunks of one (the device may still hold it; if not, torch
    raises its out-of-memory error for that chunk).
    """
    if members <= 0:
        raise ValueError(f"a cohort needs at least one member, got {members}")
    if free is None:
        return [members]
    fit = max(1, int(free * headroom) // max(1, per_member))
    count = math.ceil(members / fit)
    base, extra = divmod(members, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def plan_chunks(trainers: list, free: int | None = None) -> list[list[int]]:
    """Member positions per chunk for these lone trainers on their device; logs when it chunks.

    ``free``: bytes to plan for (None: the device's free memory, :func:`free_bytes`).
    """
    device = trainers[0].device
    free = free_bytes(device) if free is None else free
    per_member = member_step_bytes(trainers[0])
    sizes = chunk_sizes(len(trainers), per_member, free)
    if len(sizes) > 1:
        log.warning("cohort of %d members needs about %.1f MiB per member; %s has %.1f MiB free: "
                    "training it in %d chunks of at most %d", len(trainers), per_member / 2**20, device,
                    free / 2**20, len(sizes), max(sizes))
    chunks, start = [], 0
    for size in sizes:
        chunks.append(list(range(start, start + size)))
        start += size
    return chunks

"""Which trials can share a cohort (torch-free: the planner and ``ksweep validate`` use it).

A cohort trains K trials as one vectorized computation (workers/cohort/trainer.py), so its
members must agree on every shape and on the recipe's budget, the collapse remedies among
them (``model.word_dropout`` adds a parameter; the training phases decide which slices each
update moves); they may differ in the loss stack (alpha, terms, beta, free bits), the
optimiser's learning rate, weight decay and clipping, the seed, the run name and the
NaN-injection testing aid.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

#: TrainingConfig fields that may differ between the members of one cohort.
PER_MEMBER_TRAINING = ("learning_rate", "weight_decay", "grad_clip", "inject_nan_at_step")


def cohort_key(config: Any) -> str:
    """A string equal for two TrialConfigs exactly when they may share a cohort."""
    training = config.training.model_dump(mode="json")
    for name in PER_MEMBER_TRAINING:
        training.pop(name, None)
    data = config.data.model_dump(mode="json")
    data.pop("seed", None)  # another data sample of the same shapes is fine
    key = {"data": data, "base": config.base.model_dump(mode="json"),
           "model": config.model.model_dump(mode="json"), "training": training}
    return json.dumps(key, sort_keys=True)


def cohort_problem(config: Any) -> str | None:
    """Why a config cannot train in a cohort of more than one (None: it can)."""
    if config.model.dropout > 0:
        return ("model.dropout > 0: cohorts reproduce each member's lone run exactly and do "
                "not implement dropout; set model.dropout: 0 or resources.cohort_size: 1")
    return None


def group_cohorts(configs: Sequence[Any], size: int) -> list[list[int]]:
    """Indices of ``configs`` grouped into cohorts of at most ``size`` compatible members.

    Order is kept within a group; a config with a :func:`cohort_problem` is a group of one.
    """
    if size < 1:
        raise ValueError(f"cohort size must be >= 1, got {size}")
    groups: dict[str, list[list[int]]] = {}
    singles: list[list[int]] = []
    for index, config in enumerate(configs):
        if size == 1 or cohort_problem(config) is not None:
            singles.append([index])
            continue
        chunks = groups.setdefault(cohort_key(config), [[]])
        if len(chunks[-1]) == size:
            chunks.append([])
        chunks[-1].append(index)
    return [chunk for chunks in groups.values() for chunk in chunks] + singles


def fingerprint(data) -> str:
    """A digest of a split's training tensors (equal digests: the same data; duck-typed, no torch import)."""
    digest = hashlib.sha1()
    for tensor in (data.split.context, data.split.target, data.split.mask, data.base_nll):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()

"""The z-free base of a registered dataset: learned on its train split, precomputed, or a
registered language model's (:func:`dataset_base` says which does what).

The synthetic task's ``oracle`` does not exist for a dataset and is refused by name. c_base is
the mean over train examples of b_u, computed once per (dataset, split, base).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from workers.datasets.source import DatasetTask
from workers.models.config import BaseModelConfig
from workers.zfree.base import (
    BASE_CACHE_VERSION,
    BaseSurprisal,
    c_base_of,
    learned_base,
    score_split,
)


def dataset_base_cache_key(task: DatasetTask, base: BaseModelConfig) -> str:
    """Content address of a dataset's learned base: (dataset hash, split-assignment hash, target
    length and truncation, base config)."""
    config = task.config
    payload = json.dumps({
        "dataset_sha256": config.sha256, "split_hash": task.split_hash,
        "max_target_length": task.max_target_length, "truncation": config.truncation,
        "base": base.model_dump(mode="json"), "version": BASE_CACHE_VERSION,
    }, sort_keys=True)
    return "ds-" + hashlib.sha256(payload.encode()).hexdigest()[:24]


def dataset_base(task: DatasetTask, base: BaseModelConfig, cache_root: Path | str,
                 device: torch.device | str = "cpu") -> tuple[BaseSurprisal, torch.Tensor]:
    """b_t on train and val with c_base, and b_t on test, for a dataset trial.

    - ``learned``: the z-free GRU decoder (:func:`workers.zfree.base.learned_base`), trained on
      the train split only, over the compacted vocabulary, cached by
      :func:`dataset_base_cache_key`: a trial never scores as val or test a row its base saw;
    - ``precomputed``: the dataset's ``base_nll`` column (b_t in nats of the original ids,
      aligned with ``y``, cut like ``y`` under ``truncation: head``);
    - ``causal_lm``: a registered language model's b_t (:mod:`workers.zfree.causal_lm`).

    Raises:
        ValueError: ``base.kind: oracle`` (synthetic only), or ``precomputed`` on a dataset
            without a ``base_nll`` column; each names the field and the fix.
    """
    name = task.config.dataset
    if base.kind == "oracle":
        raise ValueError(
            f"base.kind: 'oracle' is the synthetic task's exact model and does not exist for "
            f"dataset {name!r}; use base.kind: learned (a z-free GRU trained on the train split) "
            "or precomputed (the dataset's base_nll column)")
    splits = task.splits
    if base.kind == "precomputed":
        if task.base_nll is None:
            raise ValueError(
                f"base.kind: 'precomputed' reads the base_nll column, which dataset {name!r} does "
                "not have; register the dataset with a base_nll column, or use base.kind: learned")
        train, val, test = (task.base_nll[s] * splits[s].mask for s in ("train", "val", "test"))
        return BaseSurprisal(train, val, c_base_of(splits["train"], train), "precomputed"), test
    if base.kind == "causal_lm":
        from workers.zfree.causal_lm import causal_lm_base

        return causal_lm_base(task, base, cache_root, device)
    if base.kind != "learned":
        raise ValueError(f"base.kind: {base.kind!r} is not available for a dataset here; use "
                         "learned or precomputed")
    describe = {"dataset": name, "dataset_sha256": task.config.sha256,
                "split_hash": task.split_hash}
    surprisal = learned_base(dataset_base_cache_key(task, base), describe, base, task.vocab_size,
                             splits["train"], splits["val"], cache_root, device)
    return surprisal, score_split(task, surprisal, splits["test"], device)

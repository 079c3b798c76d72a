"""A trial's data and z-free base, from the synthetic task or a registered dataset.

:func:`load_sources` gives the trainer the same things for both: the three splits as
:class:`~workers.readouts.evaluate.SplitData`, the base (b_t, c_base) and a
:class:`TaskView` saying what the read-outs can compute (kinds or groups, a label, an
oracle h_t). The synthetic path is today's, call for call (same RNG draws).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workers.contract import COMPACT_B_U
from workers.data import KINDS, generate_splits
from workers.data.config import DatasetDataConfig, SyntheticTaskConfig
from workers.readouts.split_data import SplitData
from workers.train.config import TrialConfig
from workers.zfree.base import BaseSurprisal, load_or_train_base, score_split


@dataclass(frozen=True)
class TaskView:
    """What the read-outs know about the data source.

    Attributes:
        vocab_size: the model's vocabulary (a dataset's compacted one plus PAD and BOS).
        num_strategies: default K of the discrete latent (a dataset: its label count).
        kinds: names of the kind codes (the synthetic kinds, or a dataset's groups).
        has_label: False for a dataset without a label column (no NMI/ARI/I(z;s)).
        has_oracle: True only for the synthetic task (h_t exists).
        dataset: the loaded dataset (None for the synthetic task).
        data_hashes: per split, a content hash of its tensors.
        info: params describing the data (a dataset's hash, split hash, sizes).
    """

    vocab_size: int
    num_strategies: int
    kinds: tuple[str, ...]
    has_label: bool
    has_oracle: bool
    dataset: object | None = None
    data_hashes: dict[str, str] = field(default_factory=dict)
    info: dict[str, object] = field(default_factory=dict)


def load_sources(config: TrialConfig, cache_root: Path | str, device: torch.device
                 ) -> tuple[TaskView, dict[str, SplitData], BaseSurprisal]:
    """The splits (as SplitData on ``device``), the base and the view of one trial."""
    if isinstance(config.data, DatasetDataConfig):
        return _dataset_sources(config, config.data, cache_root, device)
    task = config.resolved_data()  # the data seed is the trial seed unless data.seed pins it
    assert isinstance(task, SyntheticTaskConfig)
    splits = generate_splits(task)
    base = load_or_train_base(task, config.base, cache_root, device, (splits["train"], splits["val"]))
    test_nll = score_split(task, base, splits["test"], device)
    data = {name: SplitData.build(task, splits[name], nll, config.alpha, device) for name, nll in
            (("train", base.train_nll), ("val", base.val_nll), ("test", test_nll))}
    view = TaskView(task.vocab_size, task.num_strategies, KINDS, True, True,
                    data_hashes={name: split.data_hash() for name, split in splits.items()})
    return view, data, base


def _check_free_bits(config: TrialConfig, k: int) -> None:
    """TrialConfig's free-bits rule, once a dataset's K (its label count) is known."""
    kl = config.loss_stack.resolved_terms().get("kl")
    if kl is None or config.model.family != "discrete" or config.allow_free_bits_above_log_k:
        return
    k = config.model.num_categories or k
    free_bits = float(kl.options.get("free_bits", 0.0))
    if free_bits >= math.log(k):
        raise ValueError(
            f"loss_stack.terms.kl.options.free_bits ({free_bits:g}) must be below log K = "
            f"{math.log(k):.4g} nats (K = {k}: the dataset's label classes, or model."
            "num_categories); lower it, or set allow_free_bits_above_log_k: true")


def _dataset_sources(config: TrialConfig, data_config: DatasetDataConfig, cache_root: Path | str,
                     device: torch.device) -> tuple[TaskView, dict[str, SplitData], BaseSurprisal]:
    from workers.datasets.source import load_task
    from workers.zfree.dataset import dataset_base

    task = load_task(data_config, cache_root)
    _check_free_bits(config, task.num_strategies)
    base, test_nll = dataset_base(task, config.base, cache_root, device)
    kinds = task.groups
    data = {name: SplitData.build_dataset(task.splits[name], nll, config.alpha, device, kinds,
                                          task.has_label)
            for name, nll in (("train", base.train_nll), ("val", base.val_nll), ("test", test_nll))}
    if base.kind == "learned":  # its softmax is over the compact ids: b_t is already renormalised
        for split in data.values():
            split.surprisal[COMPACT_B_U] = split.surprisal["b_u"]
    info: dict[str, object] = {
        "dataset_sha256": data_config.sha256, "data.split_hash": task.split_hash,
        "data.vocab_size": task.vocab_size, "data.max_target_length": task.max_target_length,
        "data.truncated_rows": task.truncated_rows, "data.label_classes": len(task.label_classes or []),
        "data.groups": ",".join(kinds), "base.support": "compact" if base.kind == "learned" else "original",
        **{f"data.rows.{name}": count for name, count in task.rows.items()},
    }
    view = TaskView(task.vocab_size, task.num_strategies, kinds, task.has_label, False, task,
                    {name: split.data_hash() for name, split in task.splits.items()}, info)
    return view, data, base

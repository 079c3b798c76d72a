"""One split as the read-outs take it, and the rows an epoch end reads of each split.

:class:`SplitData` is built once per trial (:mod:`workers.train.sources`) and holds the split
on the model's device with what depends on b_t and h_t only, computed once. The train split is
read on :func:`readout_split`'s fixed, seeded random subset of its rows
(``readouts.train_subset``), not its first rows: a table sorted by label would give one class.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from objectives import token_weight_stats
from workers.contract import TRAIN
from workers.data import (
    KINDS,
    SyntheticSplit,
    SyntheticTaskConfig,
    kind_layout,
    oracle_conditional_nll,
)
from workers.readouts.surprisal import by_kind, surprisal_readouts


@dataclass
class SplitData:
    """One split with everything the read-outs need, on the model's device.

    ``surprisal`` holds the b/h-only read-outs (computed once); ``kappa`` the per-example
    kappa at the trial's alpha (CPU), ``prefix_length`` each example's prefix length.
    A dataset has no oracle: ``cond_nll`` and ``prefix_length`` are None there.
    """

    split: SyntheticSplit
    decoder_input: torch.Tensor
    base_nll: torch.Tensor
    cond_nll: torch.Tensor | None
    prefix_length: torch.Tensor | None
    kappa: torch.Tensor
    surprisal: dict[str, float]
    kinds: tuple[str, ...] = KINDS
    has_label: bool = True

    @classmethod
    def build(cls, config: SyntheticTaskConfig, split: SyntheticSplit, base_nll: torch.Tensor,
              alpha: float, device: torch.device | str) -> SplitData:
        cond = oracle_conditional_nll(config, split)
        surprisal = by_kind(surprisal_readouts, split.kind, base_nll, cond, split.mask, alpha=alpha)
        kappa = token_weight_stats(base_nll.double(), split.mask, alpha).kappa.double()
        split = split.to(device)
        prefix_length, _ = kind_layout(config, split.kind)
        return cls(split, split.decoder_input(), base_nll.to(device), cond.to(device),
                   prefix_length, kappa, surprisal)

    @classmethod
    def build_dataset(cls, split: SyntheticSplit, base_nll: torch.Tensor, alpha: float,
                      device: torch.device | str, kinds: tuple[str, ...],
                      has_label: bool) -> SplitData:
        """A dataset's split: no oracle h_t, no prefix; ``kinds`` are its group names."""
        surprisal = by_kind(surprisal_readouts, split.kind, base_nll, None, split.mask,
                            kinds=kinds, alpha=alpha)
        kappa = token_weight_stats(base_nll.double(), split.mask, alpha).kappa.double()
        split = split.to(device)
        return cls(split, split.decoder_input(), base_nll.to(device), None, None, kappa,
                   surprisal, kinds, has_label)

    def subset(self, indices: torch.Tensor) -> SplitData:
        """The rows ``indices`` (surprisal read-outs recomputed lazily by the caller if needed)."""
        device_indices = indices.to(self.split.context.device)

        def rows(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[device_indices]

        return SplitData(self.split.subset(device_indices), self.decoder_input[device_indices],
                         self.base_nll[device_indices], rows(self.cond_nll),
                         rows(self.prefix_length), self.kappa[indices.cpu()],
                         self.surprisal, self.kinds, self.has_label)


TRAIN_SUBSET_SEED = 0  # fixed: every epoch, and every trial on the same data, reads the same rows


def train_readout_rows(count: int, size: int) -> torch.Tensor:
    """``min(size, count)`` of ``count`` train rows, drawn once with a fixed seed, in row order."""
    if size >= count:
        return torch.arange(count)
    generator = torch.Generator().manual_seed(TRAIN_SUBSET_SEED)
    return torch.randperm(count, generator=generator)[:size].sort().values


def readout_split(data: SplitData, name: str, train_subset: int) -> SplitData:
    """The rows the epoch end reads of split ``name``: train, :func:`train_readout_rows` (a
    random subset, so a label-sorted table's read-out sees every class); val and test, all."""
    if name == TRAIN:
        return data.subset(train_readout_rows(len(data.split), train_subset))
    return data

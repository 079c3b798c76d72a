"""``base.kind: causal_lm`` for a dataset trial: b_t of every row under a registered model.

b_t is computed over the whole stored table (original ids, all splits) once per (dataset
hash, model hash) by :func:`workers.lm.surprisal.cached_lm_base_nll`, then laid out like the
trainer's split tensors: the split assignment is the trial's (``split_assignment``), rows cut
to ``max_target_length`` under ``truncation: head`` like ``y``, 0 off the mask. c_base is the
mean over the train split's examples of b_u, as for every other base.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from workers.contract import SPLITS
from workers.datasets.source import DatasetTask, split_assignment
from workers.datasets.store import DatasetStore
from workers.datasets.table import X, Y
from workers.lm.registry import ModelError, ModelStore
from workers.lm.surprisal import cached_lm_base_nll
from workers.models.config import BaseModelConfig
from workers.zfree.base import BaseSurprisal, c_base_of


def causal_lm_base(task: DatasetTask, base: BaseModelConfig, cache_root: Path | str,
                   device: torch.device | str = "cpu") -> tuple[BaseSurprisal, torch.Tensor]:
    """b_t on train and val with c_base, and b_t on test (module doc).

    Raises:
        ModelError: the base was not resolved (no model hash or root: run it through
            ``ksweep sweep run``/the service), or the registered files changed since.
    """
    if base.model_sha256 is None or base.model_root is None:
        raise ModelError(f"base.model {base.model!r} was not resolved to a hash and a store "
                         "root; run it through `ksweep train`/`ksweep sweep run` (which resolve it)")
    store = ModelStore(base.model_root)
    record = store.get(str(base.model))
    if record.sha256 != base.model_sha256:  # the name moved: read the pinned object's record
        record = store.object_record(base.model_sha256)
    config = task.config
    table = DatasetStore(Path(str(config.root))).open_table(str(config.sha256))
    lm = cached_lm_base_nll(
        table.column(X).to_pylist(), table.column(Y).to_pylist(),
        dataset_sha256=str(config.sha256), store=store, record=record, cache_root=cache_root,
        device=str(device), max_batch_tokens=base.max_batch_tokens)
    width = task.max_target_length
    dense = np.zeros((len(lm.rows), width), dtype=np.float32)
    for i, row in enumerate(lm.rows):
        cut = row[:width]
        dense[i, :len(cut)] = cut
    assignment = split_assignment(table, config)
    nll = {name: torch.from_numpy(dense[assignment == index]) * task.splits[name].mask
           for index, name in enumerate(SPLITS)}
    surprisal = BaseSurprisal(nll["train"], nll["val"], c_base_of(task.splits["train"], nll["train"]),
                              "causal_lm", lm.cache_hit, lm.cache_path)
    return surprisal, nll["test"]

"""A registered dataset as the trainer's data: the same split tensors the synthetic task gives.

From the store's canonical table (``workers.data.dataset_table``'s columns), for one
resolved :class:`~workers.data.config.DatasetDataConfig`:

- **Splits**: the ``split`` column when present, else a seeded split by
  ``split_fractions`` (``split_seed``; train gets ``round(f_train n)`` rows, val
  ``round(f_val n)``, test the rest). A split left empty is an error naming it.
- **Ids**: the vocabulary is compacted to the ids used in ``x`` or ``y`` across all three
  splits, and shifted above the reserved ids: original id ``v`` becomes
  ``CONTENT_START + rank(v)`` (PAD 0, BOS 1 stay reserved), so the softmax has as many
  classes as the dataset uses, not its largest id. ``original_ids`` maps back.
- **Lengths**: ``y`` is right-padded with PAD to ``max_target_length`` (unset: the longest
  y); a longer y is refused (``truncation: refuse``, naming the first such row) or cut to
  its head (``truncation: head``; ``base_nll`` cut alike, the count kept in
  ``truncated_rows``). ``x`` is left-padded with PAD and ends with one BOS column, so the
  context encoder's last state always follows a real token (an empty x is just BOS).
- **Labels and groups**: factorized (sorted distinct values) into ``strategy`` (the label
  code, for NMI/ARI/I(z;s); 0 when there is no label) and ``kind`` (the group code, the
  per-group read-outs' key; 0 when there are no groups).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from workers.data.config import BOS_ID, CONTENT_START, PAD_ID, SPLITS, DatasetDataConfig
from workers.data.dataset_store import DatasetStore
from workers.data.dataset_table import BASE_NLL, GROUP, LABEL, SPLIT, DatasetError, X, Y
from workers.data.synthetic import SyntheticSplit


@dataclass
class DatasetTask:
    """A dataset's three splits as trainer tensors, and what the read-outs need to know.

    Attributes:
        config: the resolved data config.
        splits: ``train``/``val``/``test`` -> :class:`SyntheticSplit` (``strategy`` = label
            code, ``kind`` = group code).
        vocab_size: ``CONTENT_START`` + the number of distinct ids used.
        original_ids: ``[vocab_size - CONTENT_START]`` the original id of each compact id.
        label_classes: the label values in code order (None without a label column).
        groups: the group names in code order (empty without a group column).
        base_nll: per split ``[N, T]`` float32 precomputed b_t (None without the column).
        split_hash: sha256 (16 hex) of the row -> split assignment.
        truncated_rows: rows whose y was cut (``truncation: head``).
    """

    config: DatasetDataConfig
    splits: dict[str, SyntheticSplit]
    vocab_size: int
    original_ids: np.ndarray
    label_classes: list[str] | None
    groups: tuple[str, ...]
    base_nll: dict[str, torch.Tensor] | None
    split_hash: str
    truncated_rows: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)

    @property
    def has_label(self) -> bool:
        return self.label_classes is not None

    @property
    def num_strategies(self) -> int:
        """K for the discrete latent's default: the label count (8 without a label)."""
        return max(2, len(self.label_classes)) if self.label_classes is not None else 8

    @property
    def max_target_length(self) -> int:
        return int(self.splits["train"].target.shape[1])


def _error(config: DatasetDataConfig, message: str, *, column: str | None = None,
           row: int | None = None, fix: str) -> DatasetError:
    return DatasetError(message, file=f"dataset {config.dataset!r} ({config.sha256})",
                        column=column, row=row, fix=fix)


def split_assignment(table: pa.Table, config: DatasetDataConfig) -> np.ndarray:
    """``[N]`` int8 split index per row (0 train, 1 val, 2 test); see the module doc.

    Raises:
        DatasetError: a split with no rows (naming it and the fix).
    """
    n = table.num_rows
    if SPLIT in table.column_names:
        values = table.column(SPLIT).to_numpy(zero_copy_only=False).astype(str)
        assignment = np.full(n, -1, dtype=np.int8)
        for index, name in enumerate(SPLITS):
            assignment[values == name] = index
        source = "the split column"
        fix = "add {} rows to the dataset's split column"
    else:
        fractions = config.split_fractions
        n_train = round(fractions.train * n)
        n_val = min(n - n_train, round(fractions.val * n))
        order = np.random.default_rng(config.split_seed).permutation(n)
        assignment = np.empty(n, dtype=np.int8)
        assignment[order[:n_train]] = 0
        assignment[order[n_train:n_train + n_val]] = 1
        assignment[order[n_train + n_val:]] = 2
        source = f"split_fractions {fractions.model_dump()} of {n} rows"
        fix = "raise template.data.split_fractions.{} (or add rows)"
    for index, name in enumerate(SPLITS):
        if not (assignment == index).any():
            raise _error(config, f"split {name!r} is empty under {source}",
                         column=SPLIT if SPLIT in table.column_names else None,
                         fix=fix.format(name))
    return assignment


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [N+1], values) of a list column, chunks combined (zero-copy where possible)."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    offsets = array.offsets.to_numpy().astype(np.int64)
    values = array.values.to_numpy(zero_copy_only=False)
    return offsets - offsets[0], values[offsets[0]:offsets[-1]]


def _dense(offsets: np.ndarray, values: np.ndarray, width: int, fill, dtype, *,
           left: bool = False) -> np.ndarray:
    """Rows of a flattened list column as a ``[N, width]`` array (left- or right-aligned)."""
    lengths = np.minimum(np.diff(offsets), width)
    n = lengths.size
    out = np.full((n, width), fill, dtype=dtype)
    rows = np.repeat(np.arange(n), lengths)
    starts = np.repeat(offsets[:-1], lengths)
    position = np.arange(rows.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    column = position + (width - lengths[rows] if left else 0)
    out[rows, column] = values[starts + position]
    return out


def _factorize(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    values = column.to_numpy(zero_copy_only=False)
    classes, codes = np.unique(values, return_inverse=True)
    return codes.astype(np.int64), [str(value) for value in classes]


def metric_safe(names: list[str]) -> list[str]:
    """Group names as metric-key segments: characters other than letters, digits, '_', '.'
    and '-' become '_', at most 40 characters, a name that would repeat gets its index."""
    out: list[str] = []
    for index, name in enumerate(names):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "_"
        out.append(f"{safe}_{index}" if safe in out else safe)
    return out


def build_task(table: pa.Table, config: DatasetDataConfig) -> DatasetTask:
    """The trainer tensors of a canonical table (module doc); no I/O.

    Raises:
        DatasetError: an empty split; a y longer than ``max_target_length`` under
            ``truncation: refuse`` (naming the first such row).
    """
    assignment = split_assignment(table, config)
    y_offsets, y_values = _flat(table.column(Y))
    x_offsets, x_values = _flat(table.column(X)) if X in table.column_names else (
        np.zeros(table.num_rows + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    lengths = np.diff(y_offsets)
    width = config.max_target_length or int(lengths.max())
    too_long = np.flatnonzero(lengths > width)
    if too_long.size and config.truncation == "refuse":
        raise _error(config, f"{too_long.size} targets are longer than max_target_length "
                     f"{width} (the first has {int(lengths[too_long[0]])} tokens)", column=Y,
                     row=int(too_long[0]), fix="raise template.data.max_target_length, or set "
                     "template.data.truncation: head to keep each target's first tokens")
    used = np.unique(np.concatenate([y_values, x_values]).astype(np.int64))
    target = _dense(y_offsets, np.searchsorted(used, y_values) + CONTENT_START, width, PAD_ID,
                    np.int64)
    mask = np.arange(width)[None, :] < np.minimum(lengths, width)[:, None]
    x_width = int(np.diff(x_offsets).max(initial=0))
    context = np.concatenate([
        _dense(x_offsets, np.searchsorted(used, x_values) + CONTENT_START, x_width, PAD_ID,
               np.int64, left=True),
        np.full((table.num_rows, 1), BOS_ID, dtype=np.int64)], axis=1)
    label, classes = (_factorize(table.column(LABEL)) if LABEL in table.column_names
                      else (np.zeros(table.num_rows, dtype=np.int64), None))
    group, groups = (_factorize(table.column(GROUP)) if GROUP in table.column_names
                     else (np.zeros(table.num_rows, dtype=np.int64), []))
    groups = metric_safe(groups)
    nll = None
    if BASE_NLL in table.column_names:
        n_offsets, n_values = _flat(table.column(BASE_NLL))
        nll = _dense(n_offsets, n_values.astype(np.float32), width, 0.0, np.float32)
    splits, base_nll, rows = {}, {} if nll is not None else None, {}
    for index, name in enumerate(SPLITS):
        select = assignment == index
        splits[name] = SyntheticSplit(
            context=torch.from_numpy(context[select]), target=torch.from_numpy(target[select]),
            mask=torch.from_numpy(mask[select]), strategy=torch.from_numpy(label[select]),
            kind=torch.from_numpy(group[select]))
        rows[name] = int(select.sum())
        if base_nll is not None:
            base_nll[name] = torch.from_numpy(nll[select])
    return DatasetTask(config, splits, CONTENT_START + used.size, used, classes, tuple(groups),
                       base_nll, hashlib.sha256(assignment.tobytes()).hexdigest()[:16],
                       int(too_long.size), rows, list(table.column_names))


def load_task(config: DatasetDataConfig) -> DatasetTask:
    """:func:`build_task` on the stored table of a resolved config (memory-mapped Parquet).

    Raises:
        ValueError: the config was not resolved (no sha256 or root): the caller must run
            :func:`workers.data.dataset_resolve.resolve_dataset` first.
    """
    if not config.resolved:
        raise ValueError(f"data.dataset {config.dataset!r} was not resolved to a hash and a store "
                         "root; run it through `ksweep train`/`ksweep sweep run` (which resolve it)")
    table = DatasetStore(Path(str(config.root))).open_table(str(config.sha256))
    return build_task(table, config)


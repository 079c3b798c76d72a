"""A registered dataset as the trainer's data: the same split tensors the synthetic task gives.

From the store's canonical table (:mod:`workers.datasets.table`'s columns), for one resolved
:class:`~workers.data.config.DatasetDataConfig`: the splits, the compacted vocabulary, padded
lengths, and the label and group codes (:func:`build_task` says how); kept as arrays on disk
(:mod:`workers.datasets.cache`) so a trial after the first starts at once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from workers.contract import SPLITS
from workers.data.config import BOS_ID, CONTENT_START, PAD_ID, DatasetDataConfig
from workers.data.synthetic import SyntheticSplit
from workers.datasets.cache import cached_arrays
from workers.datasets.store import DatasetStore
from workers.datasets.table import BASE_NLL, GROUP, LABEL, SPLIT, DatasetError, X, Y
from workers.datasets.train_facts import fraction_assignment


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
        column = table.column(SPLIT)
        assignment = np.full(n, -1, dtype=np.int8)
        for index, name in enumerate(SPLITS):
            assignment[pc.equal(column, name).to_numpy(zero_copy_only=False)] = index
        source = "the split column"
        fix = "add {} rows to the dataset's split column"
    else:
        assignment = fraction_assignment(n, config)
        source = f"split_fractions {config.split_fractions.model_dump()} of {n} rows"
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


def _dense(starts: np.ndarray, lengths: np.ndarray, values: np.ndarray, width: int, fill,
           dtype, *, left: bool = False) -> np.ndarray:
    """Rows ``values[starts[i]:starts[i] + lengths[i]]`` as a ``[N, width]`` array padded with
    ``fill`` (left- or right-aligned; a longer row keeps its head). One gather, no Python loop."""
    lengths = np.minimum(lengths, width)
    columns = np.arange(width)[None, :]
    shift = (width - lengths)[:, None] if left else 0
    valid = (columns >= shift) if left else (columns < lengths[:, None])
    if values.size == 0:
        return np.full((lengths.size, width), fill, dtype=dtype)
    index_type = np.int32 if values.size < 2**31 else np.int64  # half the index traffic
    source = starts.astype(index_type)[:, None] + columns.astype(index_type) - shift
    np.clip(source, 0, values.size - 1, out=source)
    return np.where(valid, values[source], np.asarray(fill, dtype=dtype)).astype(dtype, copy=False)


def _compact(*values: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The sorted distinct ids of ``values`` and each array mapped to ``CONTENT_START + rank``.

    O(n) through a lookup table while the largest id is below 2^25 (a tokenizer's range),
    else sort-based (np.unique + searchsorted)."""
    present = [v for v in values if v.size]
    top = max((int(v.max()) for v in present), default=0)
    if top < 1 << 25:
        seen = np.zeros(top + 1, dtype=bool)
        for v in present:
            seen[v] = True
        used = np.flatnonzero(seen)
        table = np.zeros(top + 1, dtype=np.int64)
        table[used] = np.arange(used.size) + CONTENT_START
        return used, [table[v] for v in values]
    used = np.unique(np.concatenate(present))
    return used, [np.searchsorted(used, v) + CONTENT_START for v in values]


def _factorize(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Codes in the order of the sorted distinct values (dictionary-encoded by pyarrow)."""
    encoded = pc.dictionary_encode(column).combine_chunks()
    dictionary = encoded.dictionary.to_pylist()
    order = sorted(range(len(dictionary)), key=lambda i: dictionary[i])
    rank = np.empty(len(dictionary), dtype=np.int64)
    rank[order] = np.arange(len(dictionary))
    codes = rank[encoded.indices.to_numpy(zero_copy_only=False)]
    return codes, [str(dictionary[i]) for i in order]


def metric_safe(names: list[str]) -> list[str]:
    """Group names as metric-key segments: characters other than letters, digits, '_', '.'
    and '-' become '_', at most 40 characters, a name that would repeat gets its index."""
    out: list[str] = []
    for index, name in enumerate(names):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "_"
        out.append(f"{safe}_{index}" if safe in out else safe)
    return out


def build_task(table: pa.Table, config: DatasetDataConfig) -> DatasetTask:
    """The trainer tensors of a canonical table; no I/O.

    - Splits: the ``split`` column when present, else a seeded split by ``split_fractions``
      (``split_seed``; train gets ``round(f_train n)`` rows, val ``round(f_val n)``, test the
      rest). A split left empty is an error naming it.
    - Ids: the vocabulary is compacted to the ids used in ``x`` or ``y`` across all three
      splits, shifted above the reserved ids: original id ``v`` becomes
      ``CONTENT_START + rank(v)`` (PAD 0, BOS 1 stay reserved), so the softmax has as many
      classes as the dataset uses, not its largest id. ``original_ids`` maps back.
    - Lengths: ``y`` is right-padded with PAD to ``max_target_length`` (unset: the longest y); a
      longer y is refused (``truncation: refuse``, naming the first such row) or cut to its head
      (``truncation: head``; ``base_nll`` cut alike, the count kept in ``truncated_rows``).
      ``x`` is left-padded with PAD and ends with one BOS column, so the context encoder's last
      state always follows a real token (an empty x is just BOS).
    - Labels and groups: factorized (sorted distinct values) into ``strategy`` (the label code,
      for NMI/ARI/I(z;s); 0 without a label) and ``kind`` (the group code; 0 without groups).

    Rows are ordered train, val, test (each in table order), so each split is a view of
    one padded array: every column is gathered once.

    Raises:
        DatasetError: an empty split; a y longer than ``max_target_length`` under
            ``truncation: refuse`` (naming the first such row).
    """
    n = table.num_rows
    assignment = split_assignment(table, config)
    y_offsets, y_values = _flat(table.column(Y))
    x_offsets, x_values = _flat(table.column(X)) if X in table.column_names else (
        np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    lengths = np.diff(y_offsets)
    width = config.max_target_length or int(lengths.max())
    too_long = np.flatnonzero(lengths > width)
    if too_long.size and config.truncation == "refuse":
        raise _error(config, f"{too_long.size} targets are longer than max_target_length "
                     f"{width} (the first has {int(lengths[too_long[0]])} tokens)", column=Y,
                     row=int(too_long[0]), fix="raise template.data.max_target_length, or set "
                     "template.data.truncation: head to keep each target's first tokens")
    used, (y_ids, x_ids) = _compact(y_values.astype(np.int64, copy=False),
                                    x_values.astype(np.int64, copy=False))
    order = np.argsort(assignment, kind="stable")
    y_len, x_len = lengths[order], np.diff(x_offsets)[order]
    target = _dense(y_offsets[:-1][order], y_len, y_ids, width, PAD_ID, np.int64)
    mask = np.arange(width)[None, :] < np.minimum(y_len, width)[:, None]
    x_width = int(x_len.max(initial=0))
    context = np.full((n, x_width + 1), BOS_ID, dtype=np.int64)
    context[:, :x_width] = _dense(x_offsets[:-1][order], x_len, x_ids, x_width, PAD_ID, np.int64,
                                  left=True)
    label, classes = (_factorize(table.column(LABEL)) if LABEL in table.column_names
                      else (np.zeros(n, dtype=np.int64), None))
    group, groups = (_factorize(table.column(GROUP)) if GROUP in table.column_names
                     else (np.zeros(n, dtype=np.int64), []))
    groups = metric_safe(groups)
    nll = None
    if BASE_NLL in table.column_names:
        n_offsets, n_values = _flat(table.column(BASE_NLL))
        nll = _dense(n_offsets[:-1][order], y_len, n_values.astype(np.float32, copy=False),
                     width, 0.0, np.float32)
    arrays = {"context": context, "target": target, "mask": mask, "label": label[order],
              "group": group[order], "original_ids": used}
    if nll is not None:
        arrays["base_nll"] = nll
    meta = {"counts": np.bincount(assignment, minlength=len(SPLITS)).tolist(),
            "label_classes": classes, "groups": groups,
            "split_hash": hashlib.sha256(assignment.tobytes()).hexdigest()[:16],
            "truncated_rows": int(too_long.size), "columns": list(table.column_names)}
    return task_from_arrays(config, arrays, meta)


def task_arrays(task: DatasetTask) -> tuple[dict[str, np.ndarray], dict]:
    """The task as arrays whose rows are ordered train, val, test, and its meta: what
    :func:`task_from_arrays` reads back (the cache's entry)."""
    splits = [task.splits[name] for name in SPLITS]
    columns = {"context": [s.context for s in splits], "target": [s.target for s in splits],
               "mask": [s.mask for s in splits], "label": [s.strategy for s in splits],
               "group": [s.kind for s in splits]}
    if task.base_nll is not None:
        columns["base_nll"] = [task.base_nll[name] for name in SPLITS]
    arrays = {name: np.concatenate([p.numpy() for p in parts]) for name, parts in columns.items()}
    arrays["original_ids"] = task.original_ids
    meta = {"counts": [task.rows[name] for name in SPLITS],
            "label_classes": task.label_classes, "groups": list(task.groups),
            "split_hash": task.split_hash, "truncated_rows": task.truncated_rows,
            "columns": task.columns, "dataset": task.config.dataset, "sha256": task.config.sha256}
    return arrays, meta


def task_from_arrays(config: DatasetDataConfig, arrays: dict[str, np.ndarray],
                     meta: dict) -> DatasetTask:
    """A task over padded arrays whose rows are ordered train, val, test (each split a view)."""
    bounds = np.concatenate([[0], np.cumsum(meta["counts"])])
    splits, rows = {}, {}
    base_nll: dict[str, torch.Tensor] | None = {} if "base_nll" in arrays else None
    for index, name in enumerate(SPLITS):
        part = slice(int(bounds[index]), int(bounds[index + 1]))
        splits[name] = SyntheticSplit(
            context=torch.from_numpy(arrays["context"][part]),
            target=torch.from_numpy(arrays["target"][part]),
            mask=torch.from_numpy(arrays["mask"][part]),
            strategy=torch.from_numpy(arrays["label"][part]),
            kind=torch.from_numpy(arrays["group"][part]))
        rows[name] = int(meta["counts"][index])
        if base_nll is not None:
            base_nll[name] = torch.from_numpy(arrays["base_nll"][part])
    used = arrays["original_ids"]
    return DatasetTask(config, splits, CONTENT_START + used.size, used, meta["label_classes"],
                       tuple(meta["groups"]), base_nll, meta["split_hash"],
                       meta["truncated_rows"], rows, list(meta["columns"]))


def load_task(config: DatasetDataConfig, cache_root: Path | str | None = None) -> DatasetTask:
    """:func:`build_task` on the stored table of a resolved config (memory-mapped Parquet).

    With ``cache_root`` the built arrays are kept under ``cache_root/dataset_tensors``
    (:mod:`workers.datasets.cache`): the first trial of a (dataset, split, length) builds
    them, every later one memory-maps them. Before either, the stored table's hash is checked
    once per process (:func:`workers.datasets.verify.verify_once`).

    Raises:
        DatasetError: the stored table no longer hashes to ``config.sha256``.
        ValueError: the config was not resolved (no sha256 or root): the caller must run
            :func:`workers.datasets.resolve.resolve_dataset` first.
    """
    if not config.resolved:
        raise ValueError(f"data.dataset {config.dataset!r} was not resolved to a hash and a store "
                         "root; run it through `ksweep train`/`ksweep sweep run` (which resolve it)")
    from workers.datasets.verify import verify_once

    verify_once(config)  # once per process: a changed stored copy stops the trial here
    def built() -> DatasetTask:
        return build_task(DatasetStore(Path(str(config.root))).open_table(str(config.sha256)), config)

    if cache_root is None:
        return built()
    return task_from_arrays(config, *cached_arrays(config, Path(cache_root),
                                                   lambda: task_arrays(built())))

"""b_t from a causal language model: per-token surprisal of y given x, batched, cached.

For one example with context ids x and target ids y_1..y_n, the model reads
``prefix + y_1..y_{n-1}`` with ``prefix = x`` (or ``[BOS]`` when x is empty, see
:func:`workers.lm.loading.bos_token_id`) and b_t = -log p(y_t | prefix, y_<t) in nats, read
at position ``len(prefix) - 1 + t``. Batches are right-padded with an attention mask and
explicit position ids 0..L-1, so a padded row computes what it would alone; logits are upcast
to float32 before log_softmax. Rows are sorted by length and packed under a token budget.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

from workers.lm.registry import ModelError, ModelRecord, ModelStore

SURPRISAL_CACHE_VERSION = 1


@dataclass(frozen=True)
class LMBaseNLL:
    """b_t of every row of a dataset under one model.

    Attributes:
        rows: per row, float32 ``[len(y)]`` surprisal in nats.
        c_base: mean over the ``train_rows`` examples of each one's token mean of b.
        seconds: wall time of the computation (the first, uncached one).
        tokens: target tokens scored.
        cache_hit: True when read from the cache.
        cache_path: the cache folder.
    """

    rows: list[np.ndarray]
    c_base: float
    seconds: float
    tokens: int
    cache_hit: bool
    cache_path: Path


def token_batches(lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Row indices grouped longest first so that ``rows * longest <= max_batch_tokens``."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and ((len(current) + 1) * longest > max_batch_tokens
                        or len(current) >= max_batch_size):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def model_inputs(model: Any, x_ids: Sequence[Sequence[int]], y_ids: Sequence[Sequence[int]],
                 bos_id: int) -> list[list[int]]:
    """Each example's ids as the base model reads them: x (or BOS where x is empty), then y.

    Raises:
        ModelError: the counts differ, a y is empty, or an id is outside the model's
            vocabulary (naming the row).
    """
    if len(x_ids) != len(y_ids):
        raise ModelError(f"x has {len(x_ids)} rows and y {len(y_ids)}: give one x per y")
    vocab = int(model.config.vocab_size)
    inputs: list[list[int]] = []
    for row, (x, y) in enumerate(zip(x_ids, y_ids, strict=True)):
        if len(y) == 0:
            raise ModelError(f"row {row}: y is empty; every example needs >= 1 target token")
        ids = [*(x if len(x) else [bos_id]), *y]
        if min(ids) < 0 or max(ids) >= vocab:
            raise ModelError(f"row {row}: token id {max(ids) if max(ids) >= vocab else min(ids)} "
                             f"is outside the model's vocabulary [0, {vocab}); the dataset was "
                             "tokenized by another tokenizer")
        inputs.append(ids)
    return inputs


def token_surprisal(
    model: Any, x_ids: Sequence[Sequence[int]], y_ids: Sequence[Sequence[int]], *, bos_id: int,
    max_batch_tokens: int = 2048, max_batch_size: int = 64, progress: bool = True,
    description: str = "b_t",
) -> list[np.ndarray]:
    """Per-token surprisal of each y given its x (module docstring), on the model's device.

    Args:
        model: a transformers causal LM (``model(input_ids, attention_mask, position_ids)``
            returning ``.logits``), in eval mode.
        x_ids, y_ids: one list of ids per example; x may be empty, y may not.
        bos_id: the context of examples whose x is empty.
        max_batch_tokens: padded tokens per forward pass (the logits take 4 * V bytes each).
        max_batch_size: rows per forward pass.
        progress: show a tqdm bar on stderr.

    Returns:
        float32 arrays, one per example, in input order.

    Raises:
        ModelError: the counts differ, a y is empty, or an id is outside the model's
            vocabulary (naming the row).
    """
    import torch
    from tqdm.auto import tqdm

    inputs = model_inputs(model, x_ids, y_ids, bos_id)
    device = next(model.parameters()).device
    results: list[np.ndarray] = [np.empty(0, np.float32)] * len(inputs)
    lengths = [len(ids) - 1 for ids in inputs]
    bar = tqdm(total=sum(len(y) for y in y_ids), unit="tok", desc=description, disable=not progress)
    with torch.inference_mode():
        for batch in token_batches(lengths, max_batch_tokens, max_batch_size):
            width = max(lengths[i] for i in batch)
            input_ids = torch.zeros(len(batch), width, dtype=torch.long)
            attention = torch.zeros(len(batch), width, dtype=torch.long)
            rows, cols, targets = [], [], []
            for r, i in enumerate(batch):
                seq = inputs[i]
                input_ids[r, :lengths[i]] = torch.tensor(seq[:-1])
                attention[r, :lengths[i]] = 1
                n_y = len(y_ids[i])
                start = lengths[i] - n_y  # = len(prefix) - 1: the position predicting y_1
                rows += [r] * n_y
                cols += range(start, start + n_y)
                targets += seq[-n_y:]
            positions = torch.arange(width).expand(len(batch), width)
            logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                           position_ids=positions.to(device), use_cache=False).logits
            picked = logits[torch.tensor(rows, device=device), torch.tensor(cols, device=device)]
            log_probs = picked.float().log_softmax(dim=-1)
            nll = -log_probs.gather(1, torch.tensor(targets, device=device)[:, None])[:, 0]
            nll = nll.clamp_min(0.0).cpu().numpy()  # -log p >= 0; a rounding -1e-7 becomes 0
            offset = 0
            for i in batch:
                n_y = len(y_ids[i])
                results[i] = nll[offset:offset + n_y].astype(np.float32)
                offset += n_y
            bar.update(len(rows))
    bar.close()
    return results


def c_base_of_rows(rows: Sequence[np.ndarray], train_rows: Sequence[int] | None = None) -> float:
    """Mean over the chosen examples (all when None) of each one's token mean of b."""
    chosen = range(len(rows)) if train_rows is None else train_rows
    means = [float(np.mean(rows[i], dtype=np.float64)) for i in chosen if len(rows[i])]
    return float(np.mean(means)) if means else float("nan")


def surprisal_cache_key(dataset_sha256: str, record: ModelRecord, bos_id: int) -> str:
    """Content address of one dataset's b_t under one model."""
    payload = json.dumps({"dataset": dataset_sha256, "model": record.sha256, "bos": bos_id,
                          "version": SURPRISAL_CACHE_VERSION}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def cached_lm_base_nll(
    x_ids: Sequence[Sequence[int]], y_ids: Sequence[Sequence[int]], *, dataset_sha256: str,
    store: ModelStore, record: ModelRecord, cache_root: Path | str,
    train_rows: Sequence[int] | None = None, device: str = "cpu",
    max_batch_tokens: int = 2048, progress: bool = True,
) -> LMBaseNLL:
    """b_t of every row, computed once per (dataset hash, model hash) and cached on disk.

    The cache folder ``cache_root/lm_base/<key>`` holds ``base_nll.parquet`` (one list<float32>
    column, one row per dataset row) and ``meta.json`` (timing, c_base over all rows). It is
    written to a temporary name and renamed under a file lock: concurrent trials compute it
    once, and a crash never leaves half a cache. c_base over ``train_rows`` is computed from
    the cached rows on every call (O(tokens)), so any split assignment reuses one entry.
    """
    from workers.lm.loading import bos_token_id, load_registered

    root = Path(cache_root).resolve() / "lm_base"
    root.mkdir(parents=True, exist_ok=True)
    model = tokenizer = None
    meta_bos = _cached_bos(root, dataset_sha256, record)
    if meta_bos is None:
        model, tokenizer = load_registered(store, record, device=device)
        meta_bos = bos_token_id(model, tokenizer)
    key = surprisal_cache_key(dataset_sha256, record, meta_bos)
    target = root / key
    hit = True
    with FileLock(root / f"{key}.lock"):
        if not (target / "meta.json").exists():
            hit = False
            if model is None:
                model, tokenizer = load_registered(store, record, device=device)
            started = time.perf_counter()
            rows = token_surprisal(model, x_ids, y_ids, bos_id=meta_bos,
                                   max_batch_tokens=max_batch_tokens, progress=progress)
            seconds = time.perf_counter() - started
            staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
            column = pa.array([r.tolist() for r in rows], type=pa.list_(pa.float32()))
            pq.write_table(pa.table({"base_nll": column}), staging / "base_nll.parquet")
            meta = {"key": key, "dataset_sha256": dataset_sha256, "model": record.name,
                    "model_sha256": record.sha256, "bos_id": meta_bos, "seconds": seconds,
                    "tokens": int(sum(len(r) for r in rows)), "c_base_all_rows": c_base_of_rows(rows),
                    "format_version": SURPRISAL_CACHE_VERSION}
            (staging / "meta.json").write_text(json.dumps(meta, indent=2))
            if target.exists():  # a stale folder without meta.json
                shutil.rmtree(target)
            os.replace(staging, target)
            (root / f"{dataset_sha256[:24]}-{record.sha256[:24]}.bos").write_text(str(meta_bos))
    meta = json.loads((target / "meta.json").read_text())
    column = pq.read_table(target / "base_nll.parquet").column("base_nll").to_pylist()
    rows = [np.asarray(r, dtype=np.float32) for r in column]
    if len(rows) != len(y_ids):
        raise ModelError(f"{target}: cached b_t has {len(rows)} rows, the dataset {len(y_ids)}; "
                         "delete the folder to recompute")
    return LMBaseNLL(rows, c_base_of_rows(rows, train_rows), float(meta["seconds"]), int(meta["tokens"]),
                     hit, target)


def _cached_bos(root: Path, dataset_sha256: str, record: ModelRecord) -> int | None:
    # The BOS id is part of the key; remembering it avoids loading the model on a cache hit.
    path = root / f"{dataset_sha256[:24]}-{record.sha256[:24]}.bos"
    return int(path.read_text()) if path.exists() else None

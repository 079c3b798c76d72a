"""Small generated datasets registered in a real DatasetStore, for the dataset-trial tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from workers.datasets.store import DatasetRecord, DatasetStore


def strategy_table(rows: int = 240, *, seed: int = 0, label: bool = True, group: bool = True,
                   base_nll: bool = False, split: bool = False, id_offset: int = 50_000,
                   max_len: int = 9) -> pa.Table:
    """Sequences whose first target tokens reveal a class (a small strategy task in table form).

    Ids start at ``id_offset`` (far above a compact vocabulary, to exercise compaction);
    y has 3..max_len tokens, x 0..4 tokens.
    """
    rng = np.random.default_rng(seed)
    classes = rng.integers(0, 3, size=rows)
    ys, xs, nlls = [], [], []
    for n in range(rows):
        length = int(rng.integers(3, max_len + 1))
        head = [id_offset + 100 + 10 * int(classes[n]) + int(rng.integers(0, 2))]
        body = (id_offset + rng.integers(0, 12, size=length - 1)).tolist()
        ys.append(head + body)
        xs.append((id_offset + rng.integers(0, 12, size=int(rng.integers(0, 5)))).tolist())
        nlls.append(rng.uniform(0.1, 3.0, size=length).astype(np.float32).tolist())
    columns: dict[str, pa.Array] = {
        "y": pa.array(ys, type=pa.list_(pa.int64())), "x": pa.array(xs, type=pa.list_(pa.int64()))}
    if label:
        columns["label"] = pa.array([f"class{c}" for c in classes], type=pa.string())
    if group:
        columns["group"] = pa.array(["short" if len(y) < 6 else "long" for y in ys], type=pa.string())
    if base_nll:
        columns["base_nll"] = pa.array(nlls, type=pa.list_(pa.float32()))
    if split:
        columns["split"] = pa.array(["train", "train", "val", "test"] * (rows // 4)
                                    + ["train"] * (rows % 4), type=pa.string())
    return pa.table(columns)


def register(root: Path | str, table: pa.Table, name: str, owner: str = "local",
             replace: bool = False) -> DatasetRecord:
    """Validate, hash and store ``table`` under ``name`` through the store's own API."""
    from workers.datasets.table import canonicalize

    store = DatasetStore(Path(root))
    return store.add(canonicalize(table, f"{name}.parquet"), name=name, owner=owner, replace=replace)


def label_in_first_token_table(rows: int = 480, *, classes: int = 4, length: int = 12,
                               seed: int = 0) -> pa.Table:
    """A known answer for latent recovery: y_1 is the label's own token, the rest is fixed.

    x is empty and every row's body is the same sequence, so y's only uncertainty is its
    label: a latent that carries it saves exactly H(label) nats (log K, balanced) on y_1, and
    no other information about y is worth a latent's capacity.
    """
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(rows) % classes)  # balanced
    body = list(range(2_000, 2_000 + length - 1))
    ys = [[1_000 + int(c)] + body for c in labels]
    return pa.table({"y": pa.array(ys, type=pa.list_(pa.int64())),
                     "x": pa.array([[] for _ in ys], type=pa.list_(pa.int64())),
                     "label": pa.array([f"class{c}" for c in labels], type=pa.string()),
                     "base_nll": pa.array([[1.0] * length for _ in ys], type=pa.list_(pa.float32()))})

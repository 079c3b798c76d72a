"""A dataset's trainer arrays cached on disk, so a trial after the first starts in milliseconds.

Keyed by what fully determines them: the content hash, the split settings (fractions and
seed, or the table's split column), ``max_target_length`` and ``truncation``, and a format
version. Written once under a file lock to a temporary folder and renamed (a crash never
leaves half an entry); read back memory-mapped copy-on-write (``mmap_mode="c"``), so a
trial touches only the pages it reads and never writes to the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from filelock import FileLock

from workers.data.config import DatasetDataConfig
from workers.datasets.source import DatasetTask, build_task
from workers.datasets.store import DatasetStore

TASK_CACHE_VERSION = 1
ARRAYS = ("context", "target", "mask", "label", "group", "original_ids", "base_nll")


def task_cache_key(config: DatasetDataConfig) -> str:
    """The entry's name (see the module doc)."""
    payload = json.dumps({
        "sha256": config.sha256, "split_fractions": config.split_fractions.model_dump(),
        "split_seed": config.split_seed, "max_target_length": config.max_target_length,
        "truncation": config.truncation, "version": TASK_CACHE_VERSION}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def cached_task(config: DatasetDataConfig, cache_root: Path) -> DatasetTask:
    """The task of a resolved config, built and cached on first use (module doc).

    Raises:
        DatasetError: as :func:`~workers.datasets.source.build_task` (nothing is cached).
    """
    from workers.datasets.source import task_from_arrays

    root = cache_root.resolve() / "dataset_tensors"
    root.mkdir(parents=True, exist_ok=True)
    key = task_cache_key(config)
    target = root / key
    if not (target / "meta.json").exists():
        with FileLock(root / f"{key}.lock"):
            if not (target / "meta.json").exists():
                table = DatasetStore(Path(str(config.root))).open_table(str(config.sha256))
                task = build_task(table, config)
                _write(task, root, target)
    meta = json.loads((target / "meta.json").read_text())
    arrays = {name: np.load(target / f"{name}.npy", mmap_mode="c")
              for name in ARRAYS if (target / f"{name}.npy").exists()}
    return task_from_arrays(config, arrays, meta)


def _write(task: DatasetTask, root: Path, target: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    splits = [task.splits[name] for name in ("train", "val", "test")]
    columns = {"context": [s.context for s in splits], "target": [s.target for s in splits],
               "mask": [s.mask for s in splits], "label": [s.strategy for s in splits],
               "group": [s.kind for s in splits]}
    if task.base_nll is not None:
        columns["base_nll"] = [task.base_nll[name] for name in ("train", "val", "test")]
    for name, parts in columns.items():
        np.save(staging / f"{name}.npy", np.concatenate([p.numpy() for p in parts]))
    np.save(staging / "original_ids.npy", task.original_ids)
    meta = {"counts": [task.rows[name] for name in ("train", "val", "test")],
            "label_classes": task.label_classes, "groups": list(task.groups),
            "split_hash": task.split_hash, "truncated_rows": task.truncated_rows,
            "columns": task.columns, "dataset": task.config.dataset, "sha256": task.config.sha256}
    (staging / "meta.json").write_text(json.dumps(meta))
    if target.exists():  # a stale folder without meta.json (a crash before the rename)
        shutil.rmtree(target)
    os.replace(staging, target)

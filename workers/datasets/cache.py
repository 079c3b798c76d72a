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
from collections.abc import Callable
from pathlib import Path

import numpy as np
from filelock import FileLock

from workers.data.config import DatasetDataConfig

TASK_CACHE_VERSION = 1
ARRAYS = ("context", "target", "mask", "label", "group", "original_ids", "base_nll")


def task_cache_key(config: DatasetDataConfig) -> str:
    """The entry's name (see the module doc)."""
    payload = json.dumps({
        "sha256": config.sha256, "split_fractions": config.split_fractions.model_dump(),
        "split_seed": config.split_seed, "max_target_length": config.max_target_length,
        "truncation": config.truncation, "version": TASK_CACHE_VERSION}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


Arrays = dict[str, np.ndarray]


def cached_arrays(config: DatasetDataConfig, cache_root: Path,
                  build: Callable[[], tuple[Arrays, dict]]) -> tuple[Arrays, dict]:
    """The arrays and meta of a resolved config's entry; ``build()`` makes them on first use
    (module doc). An error ``build`` raises caches nothing."""
    root = cache_root.resolve() / "dataset_tensors"
    root.mkdir(parents=True, exist_ok=True)
    key = task_cache_key(config)
    target = root / key
    if not (target / "meta.json").exists():
        with FileLock(root / f"{key}.lock"):
            if not (target / "meta.json").exists():
                _write(*build(), root, target)
    meta = json.loads((target / "meta.json").read_text())
    arrays = {name: np.load(target / f"{name}.npy", mmap_mode="c")
              for name in ARRAYS if (target / f"{name}.npy").exists()}
    return arrays, meta


def _write(arrays: Arrays, meta: dict, root: Path, target: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    for name, array in arrays.items():
        np.save(staging / f"{name}.npy", array)
    (staging / "meta.json").write_text(json.dumps(meta))
    if target.exists():  # a stale folder without meta.json (a crash before the rename)
        shutil.rmtree(target)
    os.replace(staging, target)

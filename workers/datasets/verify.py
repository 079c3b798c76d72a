"""Each process checks a registered dataset's hash once before it trains on it.

On the cluster every Ray worker reads the registry from a shared volume
(docs/guide/datasets.md, "On the cluster"); a copy changed or damaged there must stop a trial
instead of training on rows no hash stands for. :func:`verify_once` re-hashes the stored
canonical table (:meth:`DatasetStore.verify`'s content hash) the first time a process opens a
(store, hash) pair and remembers the answer for the process's life: later trials in the same
worker process pay nothing.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

from workers.data.config import DatasetDataConfig
from workers.datasets.limits import DatasetError
from workers.datasets.store import DatasetStore

log = logging.getLogger(__name__)
_VERIFIED: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


def verify_once(config: DatasetDataConfig) -> float:
    """Re-hash the stored table of a resolved config unless this process already did.

    Args:
        config: a resolved dataset config (``sha256`` and ``root`` filled in).

    Returns:
        Seconds the check took (0.0 when this process had already verified the pair).

    Raises:
        DatasetError: the stored table hashes to something else; the message names the
            dataset, both hashes, the file and the host. Nothing is remembered, so the next
            call checks again.
        DatasetNotFound: no stored object of that hash under the root.
        ValueError: the config was not resolved.
    """
    if not config.resolved:
        raise ValueError(f"data.dataset {config.dataset!r} was not resolved to a hash and a store root")
    root, expected = str(Path(str(config.root)).resolve()), str(config.sha256)
    key = (root, expected)
    with _LOCK:  # one check per pair even when threads of one worker start together
        if key in _VERIFIED:
            return 0.0
        from workers.datasets.table import content_hash

        store = DatasetStore(root)
        started = time.perf_counter()
        actual = content_hash(store.open_table(expected))
        took = time.perf_counter() - started
        if actual != expected:
            raise DatasetError(
                f"dataset {config.dataset!r}: the stored table hashes to sha256 {actual}, not the "
                f"registered {expected} (on host {socket.gethostname()}); it was changed or damaged "
                "after registration",
                file=str(store.data_path(expected)), column=None, row=None,
                fix="register the source file again (`ksweep data add FILE --name NAME --replace`"
                    " or POST /api/v1/datasets?replace=true) and resubmit; never edit the store")
        _VERIFIED.add(key)
    log.info("dataset %s (sha256 %s) verified in %.2f s", config.dataset, expected[:12], took)
    return took


def forget_verified() -> None:
    """Forget every verified pair (as a new process would); for tests."""
    with _LOCK:
        _VERIFIED.clear()

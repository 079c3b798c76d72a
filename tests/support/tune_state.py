"""What a killed driver's Tune state would restore, read from the sweep's state backup.

Tune deletes all but a trial's two newest checkpoints as it registers new ones, and forces a
save of its experiment state only once a trial has registered two since the last save: a kill
in between leaves a saved state that names a deleted checkpoint, which the restore fills from
the trial's newest (``sweeps.tune.state_backup.fill_deleted_checkpoints``). Kill tests about
something else wait for :func:`backup_restorable` before they kill; one makes the case.
"""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

from sweeps.tune.state_backup import BACKUP_NAME

# A trial folder and checkpoint inside Tune's pickled trial fields (stored as hex in the state).
_CHECKPOINT = re.compile(rb"/([^/\x00-\x1f]+)/checkpoint_(\d{6})")


def named_checkpoints(tune_folder: Path) -> dict[str, int] | None:
    """Each trial folder's newest checkpoint index the backed-up state names (None: no backup)."""
    try:
        stored = json.loads((tune_folder / BACKUP_NAME).read_bytes())["files"]
        state = next(base64.b64decode(text) for name, text in stored.items()
                     if name.startswith("experiment_state"))
    except (OSError, ValueError, KeyError, StopIteration):
        return None
    newest: dict[str, int] = {}
    for blob in re.findall(rb"[0-9a-f]{200,}", state):
        for trial, index in _CHECKPOINT.findall(bytes.fromhex(blob.decode())):
            newest[trial.decode()] = max(newest.get(trial.decode(), -1), int(index))
    return newest


def backup_restorable(tune_folder: Path) -> bool:
    """Whether the backed-up state exists and each trial's newest checkpoint it names is on disk."""
    named = named_checkpoints(tune_folder)
    return named is not None and all(
        (tune_folder / trial / f"checkpoint_{index:06d}").is_dir() for trial, index in named.items())


def wait_restorable(tune_folder: Path, limit_s: float = 30) -> None:
    """Return once :func:`backup_restorable` holds (Tune saves every 2 s; a polled while loop)."""
    deadline = time.monotonic() + limit_s
    while not backup_restorable(tune_folder):
        if time.monotonic() > deadline:
            raise AssertionError(f"no restorable Tune state under {tune_folder} in {limit_s} s")
        time.sleep(0.02)

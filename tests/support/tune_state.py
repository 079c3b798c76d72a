"""What a killed driver's Tune state would restore, read from the sweep's state backup.

Tune deletes all but a trial's two newest checkpoints as it registers new ones, and forces a
save of its experiment state only once a trial has registered two since the last save: a kill
in between leaves a saved state that names a deleted checkpoint, which the restore fills from
the trial's newest (``sweeps.tune.state_backup.fill_deleted_checkpoints``). Kill tests about
something else wait for :func:`backup_restorable` before they kill; one makes the case.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from sweeps.tune.state_backup import BACKUP_NAME, STATE_PATTERN, latest_checkpoints, read_backup


def cohort_trial_id(trial_id: str) -> str:
    """The Tune trial id a trial of the progress record trains under: a cohort member's id less
    its ``-m<position>`` (``sweeps.tune.member_runs.member_trial_id``); a lone trial's own."""
    return trial_id.rsplit("-m", 1)[0]


# The last parse of each backup file, by its inode, modification time and size: the kill tests
# poll every 10-20 ms and Tune saves every 2 s (each save a new file, os.replace'd), so a poll
# re-read (base64 and JSON of a 250 KB file, about 2.5 ms of CPU) only what changed.
_parsed: dict[Path, tuple[tuple[int, int, int], list[tuple[Path, int]] | None]] = {}


def named_checkpoints(backup: Path) -> list[tuple[Path, int]] | None:
    """Each trial's latest checkpoint the state in ``backup`` names, with the iteration Tune
    restores with it (None: no readable backup)."""
    try:
        stat = backup.stat()
    except OSError:
        return None
    key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    if (seen := _parsed.get(backup)) is not None and seen[0] == key:
        return seen[1]
    files = read_backup(backup)
    states = [data for name, data in (files or {}).items() if Path(name).match(STATE_PATTERN)]
    named = latest_checkpoints(states[0]) if states else None
    _parsed[backup] = (key, named)
    return named


def backup_restorable(backup: Path) -> bool:
    """Whether ``backup`` holds a state and each trial's latest checkpoint it names is on disk."""
    named = named_checkpoints(backup)
    return named is not None and all(path.is_dir() for path, _ in named)


def wait_restorable(tune_folder: Path, limit_s: float = 30, naming: str | None = None,
                    driver: subprocess.Popen | None = None) -> bool:
    """Return True once :func:`backup_restorable` holds and, with ``naming`` (a trial id), the
    saved state names a checkpoint of that trial (Tune saves every 2 s; a polled while loop).
    With ``driver``: False as soon as that process has ended (a sweep that finished first
    saves no further state to wait for)."""
    backup, deadline = tune_folder / BACKUP_NAME, time.monotonic() + limit_s

    def names_trial() -> bool:
        return naming is None or any(naming in path.parent.name for path, _ in named_checkpoints(backup) or [])

    while not (backup_restorable(backup) and names_trial()):
        if driver is not None and driver.poll() is not None:
            return False
        if time.monotonic() > deadline:
            wanted = f" naming a checkpoint of {naming}" if naming else ""
            raise AssertionError(f"no restorable Tune state{wanted} under {tune_folder} in {limit_s} s")
        time.sleep(0.02)
    return True

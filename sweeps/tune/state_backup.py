"""A whole copy of Tune's experiment state, so a driver killed mid-save still resumes.

Tune writes ``experiment_state-<session>.json`` into a staging folder, then copies it into
the sweep's Tune folder in the background, in place. A driver killed during that copy
leaves a truncated file, and ``Tuner.restore`` then logs "Failed to restore the run state"
and starts the sweep afresh under new trial ids: every trial would run (and log an MLflow
run) a second time. :class:`ExperimentStateBackup` keeps the last complete state beside it
(written whole, then renamed), and :func:`repair_experiment_state` puts it back before a
restore.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ray import tune

log = logging.getLogger(__name__)

STATE_PATTERN = "experiment_state-*.json"  # Tune's TuneController.CKPT_FILE_TMPL
BACKUP_NAME = "ksweep-experiment-state.json"  # not matching STATE_PATTERN: Tune never reads it


def _newest_state(folder: Path) -> Path | None:
    """Tune's own choice among state files: the greatest name (the newest session)."""
    return max(folder.glob(STATE_PATTERN), default=None)


def _is_whole(path: Path) -> bool:
    try:
        json.loads(path.read_bytes())
    except (OSError, ValueError):  # truncated JSON, or not UTF-8 where the copy stopped
        return False
    return True


class ExperimentStateBackup(tune.Callback):
    """After each Tune save, copies the staged (complete) state into the Tune folder.

    Tune calls the callbacks' ``get_state`` right after it has written the experiment state
    and the searcher's state to its staging folder, before syncing them up: the one hook
    that sees the state whole.
    """

    def __init__(self) -> None:
        self._staging: Path | None = None
        self._experiment: Path | None = None

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if self._staging is None and trials:  # every trial shares the experiment's storage
            storage = trials[0].storage
            self._staging = Path(storage.experiment_driver_staging_path)
            self._experiment = Path(storage.experiment_fs_path)

    def get_state(self) -> dict[str, Any] | None:
        if self._staging is None or self._experiment is None:
            return None
        staged = _newest_state(self._staging)
        if staged is None:
            return None
        partial = self._experiment / f".{BACKUP_NAME}.partial"
        try:
            shutil.copyfile(staged, partial)
            os.replace(partial, self._experiment / BACKUP_NAME)  # a kill leaves the old one whole
        except OSError as error:  # a full disk must not stop the sweep: the next save retries
            log.warning("could not back up Tune's experiment state: %s", error)
        return None  # nothing of ours to restore


def repair_experiment_state(tune_folder: Path) -> bool:
    """Put the backup in place of a truncated newest state file; True when it did.

    A whole newest state, no state, or no whole backup: nothing is touched (Tune then
    restores, starts afresh, or fails as it would have).
    """
    newest = _newest_state(tune_folder)
    backup = tune_folder / BACKUP_NAME
    if newest is None or _is_whole(newest) or not backup.exists() or not _is_whole(backup):
        return False
    partial = tune_folder / f".{BACKUP_NAME}.restoring"
    shutil.copyfile(backup, partial)
    os.replace(partial, newest)
    log.warning("Tune's experiment state %s was cut short (a kill during its save); "
                "restored the last whole copy", newest.name)
    return True

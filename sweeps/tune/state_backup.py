"""Tune's last saved state, kept whole beside the sweep, so a killed driver resumes from it.

Tune copies each save into the sweep's folder in the background; a driver killed before the
copy ends leaves a truncated state (Tune would start the sweep afresh, every trial a second
time) or the previous one, which may name a checkpoint Tune has since deleted. So each save is
kept whole (:class:`ExperimentStateBackup`) and put back before a restore
(:func:`repair_experiment_state`), and a deleted checkpoint the state names is filled with the
trial's newest whole one (:func:`fill_deleted_checkpoints`).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ray import tune

log = logging.getLogger(__name__)

STATE_PATTERN = "experiment_state-*.json"  # Tune's TuneController.CKPT_FILE_TMPL
# The searcher's files of a session (BasicVariantGenerator, SearchGenerator, Searcher).
SEARCHER_TEMPLATES = ("basic-variant-state-{}.json", "search_gen_state-{}.json",
                      "searcher-state-{}.pkl")
# Neither .json nor .pkl: a restoring Tune downloads every such file of the experiment folder into
# its staging folder and uploads that folder back at each save, so a backup named so came back
# over each newer one and the session after a second kill restored the first session's save.
BACKUP_NAME = "ksweep-state.backup"
# The name before 2026-12-08, read where a sweep saved under it (its driver then still wrote it).
LEGACY_BACKUP_NAME = "ksweep-state-backup.json"
# In a checkpoint put back under a deleted one's name: the training_iteration Tune restores.
RESTORED_AS = "ksweep-restored-as.json"
# In every trial checkpoint, the last file the trainable writes: each other file's size.
CHECKPOINT_MANIFEST = "ksweep-checkpoint.json"


def _newest_state(folder: Path) -> Path | None:
    """Tune's own choice among state files: the greatest name (the newest session)."""
    return max(folder.glob(STATE_PATTERN), default=None)


def _write_whole(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)  # a kill leaves the old file or the new one, never a part


def _saved_files(staging: Path) -> dict[str, bytes]:
    """The newest experiment state in ``staging`` and its session's searcher files."""
    state = _newest_state(staging)
    if state is None:
        return {}
    session = state.name.removeprefix("experiment_state-").removesuffix(".json")
    names = [state.name, *(t.format(session) for t in SEARCHER_TEMPLATES)]
    return {name: (staging / name).read_bytes() for name in names if (staging / name).exists()}


def read_backup(path: Path) -> dict[str, bytes] | None:
    """The files a backup holds, by name; None when it is missing or unreadable."""
    try:
        stored = json.loads(path.read_bytes())
        return {name: base64.b64decode(text) for name, text in stored["files"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ExperimentStateBackup(tune.Callback):
    """After each Tune save, copies the staged state (whole at that moment) into the Tune folder.

    Tune calls the callbacks' ``get_state`` right after it has written the experiment state
    and the searcher's state to its staging folder, before copying them up: the one hook that
    sees a save whole.
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
        backup = self._experiment / BACKUP_NAME
        try:
            files = _saved_files(self._staging)
            if files:
                body = {"files": {n: base64.b64encode(b).decode("ascii") for n, b in files.items()}}
                _write_whole(backup, json.dumps(body).encode())
        except OSError as error:  # a full disk must not stop the sweep: the next save retries
            backup.unlink(missing_ok=True)  # an older backup must not win over a newer copy
            log.warning("could not back up Tune's experiment state: %s", error)
        return None  # nothing of ours for Tune to restore


def repair_experiment_state(tune_folder: Path) -> bool:
    """Put the last save's files in place where the Tune folder lacks them whole; True when it
    changed a file. No backup (a sweep that never saved): nothing is touched."""
    backup = tune_folder / BACKUP_NAME
    # The old name only where no backup of the new name was ever written (it may be older).
    files = read_backup(backup if backup.exists() else tune_folder / LEGACY_BACKUP_NAME)
    if not files:
        return False
    changed = [name for name, data in files.items()
               if not (tune_folder / name).exists() or (tune_folder / name).read_bytes() != data]
    for name in changed:
        _write_whole(tune_folder / name, files[name])
    if changed:
        log.warning("Tune's copy of its last saved state was cut short or behind (a kill during "
                    "the copy); restored %s from the sweep's backup", ", ".join(sorted(changed)))
    return bool(changed)


def latest_checkpoints(state: bytes) -> list[tuple[Path, int]]:
    """Each trial's latest checkpoint in an experiment state: (path, its training_iteration)."""
    # Tune's own decoder of a trial's run metadata (a private module: no public reader exists).
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    latest = []
    for _, run_metadata in json.loads(state)["trial_data"]:
        manager = _TrainingRunMetadata.from_json_state(run_metadata).checkpoint_manager
        result = manager.latest_checkpoint_result if manager is not None else None
        if result is not None:
            latest.append((Path(result.checkpoint.path),
                           int(result.metrics.get("training_iteration", 0))))
    return latest


def seal_checkpoint(folder: Path) -> None:
    """Record the size of every file in ``folder``, once the checkpoint's files are written."""
    sizes = {path.relative_to(folder).as_posix(): path.stat().st_size
             for path in sorted(folder.rglob("*")) if path.is_file()}
    (folder / CHECKPOINT_MANIFEST).write_text(json.dumps(sizes))


def is_whole_checkpoint(folder: Path) -> bool:
    """True when ``folder`` holds its manifest and every file it lists at the listed size."""
    try:
        sizes = json.loads((folder / CHECKPOINT_MANIFEST).read_text())
    except (OSError, ValueError):  # absent, or itself cut short
        return False
    return isinstance(sizes, dict) and all(
        (folder / name).is_file() and (folder / name).stat().st_size == size for name, size in sizes.items())


def fill_deleted_checkpoints(tune_folder: Path) -> list[Path]:
    """Put back each trial checkpoint the state to restore names but Tune has deleted, as a copy
    of the trial's newest whole checkpoint marked with the iteration Tune restores; the filled
    paths.

    Even the last save can name a deleted checkpoint: Tune forces a save once a trial has
    registered ``num_to_keep`` checkpoints since the last one, but that registration has already
    deleted the newest checkpoint the last save names. The copy is marked with the iteration
    Tune restores (:data:`RESTORED_AS`), and the trainables hand Tune the epochs in between
    (:func:`restored_as`). Only a whole checkpoint is put back: a trial worker that outlives its
    killed driver can leave its newest one half-copied, so the trainables seal each checkpoint
    with its files' sizes (:func:`seal_checkpoint`) and the newest that matches them is chosen
    (:func:`is_whole_checkpoint`). A trial with no newer whole checkpoint is left alone (Tune
    then fails it, with its own message)."""
    state = _newest_state(tune_folder)
    if state is None:
        return []
    try:
        latest = latest_checkpoints(state.read_bytes())
    except Exception:  # noqa: BLE001 (an unreadable state is Tune's to report, not ours)
        log.warning("could not read the trial checkpoints named in %s", state, exc_info=True)
        return []
    filled = []
    for path, iteration in latest:
        if path.exists() or not path.parent.is_dir():
            continue
        newer = sorted(p for p in path.parent.glob("checkpoint_*") if p.is_dir() and p.name > path.name)
        whole = [p for p in newer if is_whole_checkpoint(p)]
        if len(whole) < len(newer):
            log.warning("skipped %d checkpoint(s) of %s that are not whole (cut short by a kill)",
                        len(newer) - len(whole), path.parent)
        if not whole:
            continue
        partial = path.with_name(f".{path.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(whole[-1], partial)
        (partial / RESTORED_AS).write_text(json.dumps({"training_iteration": iteration}))
        os.replace(partial, path)  # a kill leaves no half-filled checkpoint under Tune's name
        filled.append(path)
    if filled:
        log.warning("the saved Tune state named %d deleted trial checkpoint(s); each trial resumes "
                    "from its newest instead: %s", len(filled), ", ".join(map(str, filled)))
    return filled


def restored_as(checkpoint_folder: Path) -> int | None:
    """The iteration Tune restored with this checkpoint when it stands in for a deleted older
    one (its trainable then reports the epochs in between first); None for Tune's own."""
    marker = checkpoint_folder / RESTORED_AS
    if not marker.exists():
        return None
    return int(json.loads(marker.read_text())["training_iteration"])

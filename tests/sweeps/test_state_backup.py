"""Tune's last save after a kill mid-copy: the backup's files are put in place whole."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from sweeps.tune.state_backup import (
    BACKUP_NAME,
    CHECKPOINT_MANIFEST,
    LEGACY_BACKUP_NAME,
    ExperimentStateBackup,
    fill_deleted_checkpoints,
    is_whole_checkpoint,
    repair_experiment_state,
    restored_as,
    seal_checkpoint,
)

SESSION = "2026-12-05_02-10-29"
STATE = f"experiment_state-{SESSION}.json"
SEARCHER = f"basic-variant-state-{SESSION}.json"
WHOLE = json.dumps({"trial_data": [["t1", "m1"], ["t2", "m2"]], "runner_data": {"x": 1}})
OLDER = json.dumps({"trial_data": [["t1", "m0"]], "runner_data": {"x": 0}})


def _backup_of(tmp_path, state: str, searcher: str):
    """The backup a save of ``state`` and ``searcher`` leaves, by the callback itself."""
    staging, experiment = tmp_path / "staging", tmp_path / "tune"
    staging.mkdir(exist_ok=True)
    experiment.mkdir(exist_ok=True)
    (staging / STATE).write_text(state)
    (staging / SEARCHER).write_text(searcher)
    (staging / "experiment_state-2026-12-01_00-00-00.json").write_text(OLDER)  # an older session
    backup = ExperimentStateBackup()
    assert backup.get_state() is None and not (experiment / BACKUP_NAME).exists()  # no trial yet
    storage = SimpleNamespace(experiment_driver_staging_path=str(staging),
                              experiment_fs_path=str(experiment))
    backup.on_step_begin(0, [SimpleNamespace(storage=storage)])
    assert backup.get_state() is None  # Tune saves no callback state for it
    return experiment


def test_a_cut_short_state_and_its_searcher_come_back_from_the_last_save(tmp_path):
    tune = _backup_of(tmp_path, WHOLE, '{"counter": 2}')
    assert sorted(p.name for p in tune.iterdir()) == [BACKUP_NAME]  # only the current session
    (tune / STATE).write_text(WHOLE[: len(WHOLE) // 2])  # the copy killed halfway
    (tune / SEARCHER).write_text('{"counter": 1}')  # the previous save's searcher
    assert repair_experiment_state(tune) is True
    assert json.loads((tune / STATE).read_text()) == json.loads(WHOLE)
    assert (tune / SEARCHER).read_text() == '{"counter": 2}'  # consistent with the state
    assert repair_experiment_state(tune) is False  # in place: nothing more to do
    assert sorted(p.name for p in tune.iterdir()) == sorted([BACKUP_NAME, SEARCHER, STATE])


def test_a_whole_but_older_copy_is_replaced_and_missing_files_are_written(tmp_path):
    # The previous save's state may name a checkpoint Tune deleted since (num_to_keep).
    tune = _backup_of(tmp_path, WHOLE, '{"counter": 2}')
    (tune / STATE).write_text(OLDER)
    assert repair_experiment_state(tune) is True
    assert (tune / STATE).read_text() == WHOLE and (tune / SEARCHER).read_text() == '{"counter": 2}'


def test_the_backup_is_not_a_file_a_restoring_tune_carries_along(tmp_path, monkeypatch):
    """Tune's restore downloads every .json and .pkl of the experiment folder into its staging
    folder, and each later save uploads that folder back: a backup with such a name was put back
    over the restored session's newer one, so a second kill resumed from the first session's save
    (its state then unreadable, Tune started the sweep afresh: every trial run twice)."""
    from ray.train._internal import storage as ray_storage
    from ray.tune.execution.experiment_state import _ExperimentCheckpointManager

    # Tune's staging folder lives in the running Ray's session folder: here, one of the test's.
    monkeypatch.setattr(ray_storage, "_get_ray_train_session_dir", lambda: str(tmp_path / "session"))
    tune = _backup_of(tmp_path, WHOLE, '{"counter": 2}')
    (tune / STATE).write_text(WHOLE)
    storage = ray_storage.StorageContext(storage_path=str(tmp_path), experiment_dir_name="tune")
    _ExperimentCheckpointManager(storage=storage, checkpoint_period=2).sync_down_experiment_state()
    staged = {p.name for p in Path(storage.experiment_driver_staging_path).iterdir()}
    assert STATE in staged and BACKUP_NAME not in staged  # Tune's own files only


def test_a_backup_under_the_old_name_is_still_read(tmp_path):
    tune = _backup_of(tmp_path, WHOLE, '{"counter": 2}')
    (tune / BACKUP_NAME).rename(tune / LEGACY_BACKUP_NAME)  # saved by a driver before the rename
    assert repair_experiment_state(tune) is True
    assert (tune / STATE).read_text() == WHOLE
    # Once a backup of the new name exists, the old one (maybe older) is never read.
    (tune / BACKUP_NAME).write_text('{"files": {"experiment_state-x.json": "e30')  # cut short
    (tune / STATE).write_text(OLDER)
    assert repair_experiment_state(tune) is False and (tune / STATE).read_text() == OLDER


def test_nothing_is_touched_without_a_readable_backup(tmp_path):
    assert repair_experiment_state(tmp_path) is False  # a new sweep: no state at all
    (tmp_path / STATE).write_text(WHOLE[:40])
    assert repair_experiment_state(tmp_path) is False
    (tmp_path / BACKUP_NAME).write_text('{"files": {"experiment_state-x.json": "e30')  # cut short
    assert repair_experiment_state(tmp_path) is False
    assert (tmp_path / STATE).read_text() == WHOLE[:40]
    assert not (tmp_path / "experiment_state-x.json").exists()


def _state_naming(trial_dirs, index: int, iteration: int) -> str:
    """An experiment state whose trials' latest checkpoint is ``checkpoint_<index>`` at
    ``iteration``, as Tune writes it (its own run metadata and checkpoint manager)."""
    from ray.train import Checkpoint, CheckpointConfig
    from ray.train._internal.checkpoint_manager import _CheckpointManager
    from ray.train._internal.session import _TrainingResult
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    data = []
    for folder in trial_dirs:
        metadata = _TrainingRunMetadata()
        metadata.checkpoint_manager = _CheckpointManager(CheckpointConfig(num_to_keep=2))
        metadata.checkpoint_manager.register_checkpoint(_TrainingResult(
            Checkpoint(str(folder / f"checkpoint_{index:06d}")), {"training_iteration": iteration}))
        data.append(["{}", metadata.get_json_state()])
    return json.dumps({"trial_data": data, "runner_data": {}})


def _checkpoint(folder, text: str) -> None:
    """A trial checkpoint as the trainables write it: its files, then the seal."""
    folder.mkdir(parents=True)
    (folder / "state.pt").write_text(text)
    (folder / "members" / "member_0.pt").parent.mkdir()
    (folder / "members" / "member_0.pt").write_text(text * 3)
    seal_checkpoint(folder)


def test_a_deleted_checkpoint_the_state_names_is_put_back_from_the_trials_newest(tmp_path):
    tune = tmp_path / "tune"
    behind, current = tune / "train_trial_a", tune / "train_trial_b"
    for folder, indices in ((behind, (3, 4)), (current, (1,))):
        for index in indices:
            _checkpoint(folder / f"checkpoint_{index:06d}", f"epoch {index + 1}")
    (tune / STATE).write_text(_state_naming([behind, current], index=1, iteration=2))
    assert fill_deleted_checkpoints(tune) == [behind / "checkpoint_000001"]
    put_back = behind / "checkpoint_000001"
    assert (put_back / "state.pt").read_text() == "epoch 5"  # the trial's newest checkpoint
    assert restored_as(put_back) == 2  # the iteration Tune restores, for the trainable's replay
    assert restored_as(current / "checkpoint_000001") is None  # Tune's own: untouched
    assert sorted(p.name for p in behind.iterdir()) == [
        "checkpoint_000001", "checkpoint_000003", "checkpoint_000004"]
    assert fill_deleted_checkpoints(tune) == []  # in place: nothing more to do


def test_a_deleted_checkpoint_with_nothing_newer_is_left_to_tune(tmp_path):
    tune = tmp_path / "tune"
    (tune / "train_trial_a").mkdir(parents=True)
    (tune / STATE).write_text(_state_naming([tune / "train_trial_a"], index=1, iteration=2))
    assert fill_deleted_checkpoints(tune) == []
    (tune / STATE).write_text("{ cut short")
    assert fill_deleted_checkpoints(tune) == []  # an unreadable state is Tune's to report


@pytest.mark.parametrize("cut", ["a file short", "a file missing", "no manifest", "the manifest short"])
def test_a_deleted_checkpoint_is_put_back_from_the_newest_whole_one(tmp_path, cut):
    tune = tmp_path / "tune"
    trial = tune / "train_trial_a"
    for index in (3, 4):
        _checkpoint(trial / f"checkpoint_{index:06d}", f"epoch {index + 1}")
    cut_short = trial / "checkpoint_000004"  # as a worker outliving its killed driver left it
    assert is_whole_checkpoint(cut_short)
    if cut == "a file short":
        (cut_short / "members" / "member_0.pt").write_text("epo")
    elif cut == "a file missing":
        (cut_short / "state.pt").unlink()
    elif cut == "no manifest":
        (cut_short / CHECKPOINT_MANIFEST).unlink()
    else:
        (cut_short / CHECKPOINT_MANIFEST).write_text((cut_short / CHECKPOINT_MANIFEST).read_text()[:-5])
    assert not is_whole_checkpoint(cut_short)
    (tune / STATE).write_text(_state_naming([trial], index=1, iteration=2))
    assert fill_deleted_checkpoints(tune) == [trial / "checkpoint_000001"]
    put_back = trial / "checkpoint_000001"
    assert (put_back / "state.pt").read_text() == "epoch 4"  # the newest whole one
    assert is_whole_checkpoint(put_back) and restored_as(put_back) == 2
    # With no whole checkpoint newer than the one named, the trial is left to Tune.
    shutil.rmtree(put_back)
    shutil.rmtree(trial / "checkpoint_000003")
    assert fill_deleted_checkpoints(tune) == []
    assert not put_back.exists()

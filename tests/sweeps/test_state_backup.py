"""Tune's last save after a kill mid-copy: the backup's files are put in place whole."""

import json
from types import SimpleNamespace

from sweeps.tune.state_backup import BACKUP_NAME, ExperimentStateBackup, repair_experiment_state

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


def test_nothing_is_touched_without_a_readable_backup(tmp_path):
    assert repair_experiment_state(tmp_path) is False  # a new sweep: no state at all
    (tmp_path / STATE).write_text(WHOLE[:40])
    assert repair_experiment_state(tmp_path) is False
    (tmp_path / BACKUP_NAME).write_text('{"files": {"experiment_state-x.json": "e30')  # cut short
    assert repair_experiment_state(tmp_path) is False
    assert (tmp_path / STATE).read_text() == WHOLE[:40]
    assert not (tmp_path / "experiment_state-x.json").exists()

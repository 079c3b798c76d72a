"""Tune's experiment state after a kill mid-copy: the backup's whole copy is put back."""

import json
from types import SimpleNamespace

from sweeps.tune.state_backup import BACKUP_NAME, ExperimentStateBackup, repair_experiment_state

WHOLE = json.dumps({"trial_data": [["t1", "m1"], ["t2", "m2"]], "runner_data": {"x": 1}})


def test_a_cut_short_state_is_replaced_by_the_backup_and_a_whole_one_is_left(tmp_path):
    older = tmp_path / "experiment_state-2026-12-01_00-00-00.json"
    newest = tmp_path / "experiment_state-2026-12-05_02-10-29.json"
    older.write_text('{"old": true}')
    newest.write_text(WHOLE[: len(WHOLE) // 2])
    (tmp_path / BACKUP_NAME).write_text(WHOLE)
    assert repair_experiment_state(tmp_path) is True
    assert json.loads(newest.read_text()) == json.loads(WHOLE)
    assert older.read_text() == '{"old": true}'  # only Tune's choice (the newest) is touched
    assert repair_experiment_state(tmp_path) is False  # now whole: left alone
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([older.name, newest.name, BACKUP_NAME])


def test_nothing_is_touched_without_a_whole_backup_or_a_state(tmp_path):
    assert repair_experiment_state(tmp_path) is False  # no state at all: a new sweep
    newest = tmp_path / "experiment_state-2026-12-05_02-10-29.json"
    cut = WHOLE[:40]
    newest.write_text(cut)
    assert repair_experiment_state(tmp_path) is False  # no backup
    (tmp_path / BACKUP_NAME).write_bytes(b'{"trial_data": [\xff')  # a backup cut short too
    assert repair_experiment_state(tmp_path) is False
    assert newest.read_text() == cut


def test_the_callback_copies_the_newest_staged_state_whole(tmp_path):
    staging, experiment = tmp_path / "staging", tmp_path / "tune"
    staging.mkdir()
    experiment.mkdir()
    (staging / "experiment_state-2026-12-05_02-10-29.json").write_text(WHOLE)
    backup = ExperimentStateBackup()
    assert backup.get_state() is None and not (experiment / BACKUP_NAME).exists()  # no trial yet
    storage = SimpleNamespace(experiment_driver_staging_path=str(staging),
                              experiment_fs_path=str(experiment))
    backup.on_step_begin(0, [SimpleNamespace(storage=storage)])
    assert backup.get_state() is None  # Tune saves no callback state for it
    assert (experiment / BACKUP_NAME).read_text() == WHOLE
    assert sorted(p.name for p in experiment.iterdir()) == [BACKUP_NAME]  # no partial left

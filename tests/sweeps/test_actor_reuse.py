"""Actor reuse and kill -9: a trial whose run has just FINISHED is killed with its driver.

Tune records a finished trial as TERMINATED in its experiment state some time after the
trial's function returned (``TUNE_GLOBAL_CHECKPOINT_S``); a driver killed in between restores
that trial as unfinished, from its last checkpoint (the final epoch). The resumed trial must
then leave its FINISHED run alone: no second run, no point logged twice, the end time kept.
Sweeps reuse trial actors (``reuse_actors=True``), so the next trial of a slot runs in the
same process as the one just finished: that is the case killed here, with Tune's state file
cut short as a kill during its copy leaves it. One CPU: one trial (or cohort) at a time, in
one reused actor.
"""

import contextlib
import os
import shutil
import signal
import sqlite3
import time

import pytest

from sweeps.status import read_status
from sweeps.tune.state_backup import BACKUP_NAME, STATE_PATTERN
from tests.support.tune_state import backup_restorable, named_checkpoints
from tests.sweeps.test_ray_faults import _logged_epochs, _steps_per_worker, _trial_dir
from tests.sweeps.test_runner import SMALL_DATA, _runs, _sweep, _write_spec

pytestmark = pytest.mark.slow
EPOCHS = 4


def _finished_child_runs(db) -> int:
    """Child runs (the parent carries no ``mlflow.parentRunId``) whose status is FINISHED."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as connection:
            row = connection.execute(
                "SELECT COUNT(*) FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                "WHERE t.key = 'mlflow.parentRunId' AND r.status = 'FINISHED'").fetchone()
    except sqlite3.OperationalError:  # schema not there yet, or the writer holds a lock
        return 0
    return int(row[0])


def _points_logged_twice(db, run_id: str) -> list[tuple[str, int, int]]:
    """Each (metric, step) of the run with more than one point, read straight from sqlite: one
    query, not a get_metric_history call per metric (about 150 a run, 1 ms of CPU each)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as connection:
        return connection.execute(
            "SELECT key, step, COUNT(*) FROM metrics WHERE run_uuid = ? GROUP BY key, step "
            "HAVING COUNT(*) > 1", (run_id,)).fetchall()


def _save_of(backup) -> tuple[int, int, int] | None:
    """Which save ``backup`` holds (each is a new file, replaced whole): None while there is none."""
    try:
        stat = backup.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("cohort_size", [1, "auto"])
def test_kill_right_after_a_trial_finished_does_not_rerun_it(tmp_path, cohort_size):
    # cohort_size 1: actor reuse, one lone trial after another in one actor. auto (the
    # default): the 4 trials are one cohort, killed as soon as two members' runs FINISHED at
    # its last epoch; a restored cohort must replay them without touching their runs.
    # A quarter of the data: the kill waits for the runs and Tune's save, not for an epoch count.
    spec = _write_spec(tmp_path, "reuse", {**SMALL_DATA, "template.training.epochs": EPOCHS,
                                           "seeds": 1, "loss_stacks": ["uniform", "raw_plus_ncc"],
                                           "budget.max_concurrent_trials": 1,
                                           "resources.cohort_size": cohort_size})
    process = _sweep(tmp_path, spec, "ru1", num_cpus=1)
    db = tmp_path / "mlflow.db"
    tune_folder = tmp_path / "root" / "ru1" / "tune"
    deadline = time.time() + 600
    # Killed before Tune first saved its experiment state, the driver would start the sweep
    # afresh under new trial ids (not what this test is about): trials without per-trial PNGs
    # can finish two in less than its save period. The backup is written before the state; a
    # save that names a checkpoint Tune has since deleted is the next test's case.
    while _finished_child_runs(db) < 2 or not backup_restorable(tune_folder / BACKUP_NAME):
        if process.poll() is not None:
            pytest.fail(f"the sweep ended before it could be killed: {process.stdout.read()}")
        if time.time() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail("two trials did not finish in time")
        time.sleep(0.02)
    # The second trial ran in the first one's actor; kill as soon as its run is FINISHED,
    # before Tune can record it as TERMINATED.
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    # As if the kill had landed while Tune copied its state file into the sweep folder (it
    # once did, by chance): the restore must use the last whole copy, not start afresh.
    state = max(tune_folder.glob(STATE_PATTERN))
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    _, _, _, before = _runs(tmp_path, "quickstart", "ru1")
    finished_before = {c.info.run_id: c.info.end_time for c in before
                       if c.info.status == "FINISHED"}
    assert len(finished_before) >= 2
    restarted = _sweep(tmp_path, spec, "ru1", num_cpus=1)
    output, _ = restarted.communicate(timeout=900)
    assert restarted.returncode == 0, output
    client, _, parents, children = _runs(tmp_path, "quickstart", "ru1")
    assert len(parents) == 1
    trial_ids = [c.data.tags["ksweep.trial_id"] for c in children]
    assert len(children) == 4 and len(set(trial_ids)) == 4, trial_ids
    for child in children:
        assert child.info.status == "FINISHED"
        if child.info.run_id in finished_before:  # not touched after the kill
            assert child.info.end_time == finished_before[child.info.run_id], trial_ids
        assert _points_logged_twice(db, child.info.run_id) == []
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val/loss")]
        assert steps == list(range(1, EPOCHS + 1))
        assert [m.step for m in client.get_metric_history(child.info.run_id, "selected/epoch")
                ] == [EPOCHS]
    status = read_status(tmp_path / "root" / "ru1" / "status.json")
    states = [(t["trial_id"], t["state"], t.get("epochs"), t.get("error")) for t in status.trials]
    assert (status.state, status.done, status.failed) == ("succeeded", 4, 0), states


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("cohort_size", [1, 2])
def test_a_saved_state_naming_deleted_checkpoints_resumes_the_trial_from_its_newest(tmp_path, cohort_size):
    """A driver killed with its last save epochs behind (Tune has deleted the checkpoint that
    save names): the trial (a lone one, or a cohort of two) resumes from its newest checkpoint,
    brings Tune up to date (a lone trial replays the epochs in between from its history, a
    cohort reports its members' records once) and logs no epoch twice."""
    epochs = 16
    stacks = ["raw_token_weighted", "uniform"][:cohort_size]
    # A quarter of the data: Tune's first save names epoch 2 or so, and 16 epochs leave room.
    spec = _write_spec(tmp_path, "behind", {**SMALL_DATA, "template.training.epochs": epochs,
                                            "seeds": 1, "alpha": [1], "loss_stacks": stacks,
                                            "resources.cohort_size": cohort_size})
    process = _sweep(tmp_path, spec, "bh1", num_cpus=1)
    tune_folder, db = tmp_path / "root" / "bh1" / "tune", tmp_path / "mlflow.db"
    deadline = time.time() + 600
    snapshot, candidate, judged = None, tmp_path / "save.json", None
    while True:  # keep the first save that names a checkpoint; kill four epochs past it
        if snapshot is None and (saved := _save_of(tune_folder / BACKUP_NAME)) not in (None, judged):
            judged = saved  # each save judged once (Tune saves every 2 s, this polls every 10 ms)
            shutil.copyfile(tune_folder / BACKUP_NAME, candidate)  # the save judged is the one kept
            if (named := named_checkpoints(candidate)) and backup_restorable(candidate):
                snapshot, named_epoch = candidate.read_bytes(), max(iteration for _, iteration in named)
        if snapshot is not None and _logged_epochs(db) >= named_epoch + 4:
            break
        if process.poll() is not None or time.time() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"no kill four epochs past a save (logged {_logged_epochs(db)})")
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    (tune_folder / BACKUP_NAME).write_bytes(snapshot)  # that save, as if Tune had made no other
    for state in tune_folder.glob(STATE_PATTERN):
        state.write_bytes(state.read_bytes()[:100])
    assert not backup_restorable(tune_folder / BACKUP_NAME), "the save must name a checkpoint Tune deleted"
    restarted = _sweep(tmp_path, spec, "bh1", num_cpus=1)
    output, _ = restarted.communicate(timeout=900)
    assert restarted.returncode == 0, output
    assert "deleted trial checkpoint" in output
    client, _, _, children = _runs(tmp_path, "quickstart", "bh1")
    assert len(children) == cohort_size
    for child in children:
        assert child.info.status == "FINISHED"
        assert _points_logged_twice(db, child.info.run_id) == []
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val/loss")]
        assert steps == list(range(1, epochs + 1)), steps
    status = read_status(tmp_path / "root" / "bh1" / "status.json")
    assert (status.state, status.done, status.failed) == ("succeeded", cohort_size, 0)
    assert [t["epochs"] for t in status.trials] == [epochs] * cohort_size
    *_, resumed = _steps_per_worker(_trial_dir(tmp_path, "bh1"))
    print(f"the save named epoch {named_epoch}; Tune's results after the restore: {resumed}")
    assert resumed[0] == named_epoch + 1  # Tune's count goes on from the save, caught up first
    if cohort_size == 1:  # each epoch replayed, then the new ones: Tune's count is the epoch
        assert resumed == list(range(named_epoch + 1, epochs + 1))

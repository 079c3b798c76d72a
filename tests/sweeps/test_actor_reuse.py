"""Actor reuse and kill -9: a trial whose run has just FINISHED is killed with its driver.

Tune records a finished trial as TERMINATED in its experiment state some time after the
trial's function returned (``TUNE_GLOBAL_CHECKPOINT_S``); a driver killed in between restores
that trial as unfinished, from its last checkpoint (the final epoch). The resumed trial must
then leave its FINISHED run alone: no second run, no point logged twice, the end time kept.
Sweeps reuse trial actors (``reuse_actors=True``), so the next trial of a slot runs in the
same process as the one just finished: that is the case killed here, with Tune's state file
cut short as a kill during its copy leaves it.
"""

import os
import signal
import sqlite3
import time
from collections import Counter

import pytest

from sweeps.tune.state_backup import STATE_PATTERN
from sweeps.tune.status import read_status
from tests.support.tune_state import backup_restorable
from tests.sweeps.test_runner import _runs, _sweep, _write_spec

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


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("cohort_size", [1, "auto"])
def test_kill_right_after_a_trial_finished_does_not_rerun_it(tmp_path, cohort_size):
    # cohort_size 1: actor reuse, one lone trial after another in one actor. auto (the
    # default): the 4 trials are one cohort, killed as soon as two members' runs FINISHED at
    # its last epoch; a restored cohort must replay them without touching their runs.
    spec = _write_spec(tmp_path, "reuse", {"template.training.epochs": EPOCHS, "seeds": 1,
                                           "loss_stacks": ["uniform", "raw_plus_ncc"],
                                           "budget.max_concurrent_trials": 1,
                                           "resources.cohort_size": cohort_size})
    process = _sweep(tmp_path, spec, "ru1")
    db = tmp_path / "mlflow.db"
    tune_folder = tmp_path / "root" / "ru1" / "tune"
    deadline = time.time() + 600
    # Killed before Tune first saved its experiment state, the driver would start the sweep
    # afresh under new trial ids (not what this test is about): trials without per-trial PNGs
    # can finish two in less than its save period. The backup is written before the state; a
    # state that names a deleted checkpoint is a known gap, not this test's case (tune_state.py).
    while _finished_child_runs(db) < 2 or not backup_restorable(tune_folder):
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
    restarted = _sweep(tmp_path, spec, "ru1")
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
        for key in child.data.metrics:
            steps = Counter(m.step for m in client.get_metric_history(child.info.run_id, key))
            assert all(n == 1 for n in steps.values()), (key, steps)
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val/loss")]
        assert steps == list(range(1, EPOCHS + 1))
        assert [m.step for m in client.get_metric_history(child.info.run_id, "selected/epoch")
                ] == [EPOCHS]
    status = read_status(tmp_path / "root" / "ru1" / "status.json")
    states = [(t["trial_id"], t["state"], t.get("epochs"), t.get("error")) for t in status.trials]
    assert (status.state, status.done, status.failed) == ("succeeded", 4, 0), states

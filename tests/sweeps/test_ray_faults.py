"""The fault matrix's Ray rows (docs/reliability.md), on real processes: a sweep run by the CLI on
local Ray with a temporary sqlite MLflow store, and a real SIGKILL of Ray's own processes."""

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from sweeps.status import read_status
from sweeps.tune.state_backup import STATE_PATTERN
from tests.support.sockets import listening, loopback
from tests.support.tune_state import wait_restorable
from tests.sweeps.test_runner import SMALL_DATA, _runs, _sweep, _write_spec
from workers.contract import FAILURE_TAG, RUN_KIND_TAG
from workers.settings import MIN_RUNS_ENV

pytestmark = pytest.mark.slow
# Ray reads its config overrides from RAY_<name> in every process it starts.
# The driver gives up on a lost GCS after 10 s instead of Ray's 60 s: Ray's error-listener thread
# spins a whole core while it waits (measured), so the wait costs the suite CPU, not just time.
GCS_RECONNECT_ENV = {"RAY_gcs_rpc_server_reconnect_timeout_s": "10"}


def _title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _ray_processes(driver: subprocess.Popen) -> list[psutil.Process]:
    """Every process the driver started: GCS, raylet, dashboard, workers (not the driver)."""
    try:
        return psutil.Process(driver.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _trial_workers(driver: subprocess.Popen) -> list[psutil.Process]:
    """The Ray workers running a trial: ``ray::ImplicitFunc.train`` (the function trainable)."""
    return [p for p in _ray_processes(driver)
            if _title(p).startswith("ray::") and ("ImplicitFunc" in _title(p)
                                                  or "train_trial" in _title(p))]


def _wait_for(driver: subprocess.Popen, status_path: Path, ready, what: str, limit_s: float = 600):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if driver.poll() is not None:
            pytest.fail(f"the sweep ended before {what}: {driver.communicate()[0][-3000:]}")
        status = read_status(status_path)
        if status is not None and ready(status):
            return status
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)
    pytest.fail(f"timed out waiting for {what}")


def _epochs_of(status) -> int:
    return max((int(t.get("epochs") or 0) for t in status.trials), default=0)


def _trial_dir(tmp_path: Path, sweep_id: str) -> Path:
    (folder,) = (tmp_path / "root" / sweep_id / "tune").glob("train_sweep_trial_*")
    return folder


def _steps_per_worker(trial_dir: Path) -> list[list[int]]:
    """The epochs each run of a trial reported, one list per (re)start, from Tune's
    ``result.json`` (one line per result, appended across restarts; a restart's first result
    has ``iterations_since_restore`` 1)."""
    per_start: list[list[int]] = []
    for line in (trial_dir / "result.json").read_text().splitlines():
        result = json.loads(line)
        if result["iterations_since_restore"] == 1 or not per_start:
            per_start.append([])
        per_start[-1].append(int(result["training_iteration"]))
    return per_start


def _num_failures(tmp_path: Path, sweep_id: str) -> list[int]:
    """Each trial's ``num_failures`` in Tune's experiment state."""
    (path,) = (tmp_path / "root" / sweep_id / "tune").glob("experiment_state-*.json")
    text = path.read_text().replace('\\"', '"')
    return [int(n) for n in re.findall(r'"num_failures": (\d+)', text)]


@pytest.mark.timeout(1200)
def test_kill9_of_the_trial_worker_between_its_mlflow_log_and_checkpoint_resumes_it(tmp_path):
    """``ksweep sweep run``'s own local Ray listens on loopback only and prestarts no worker.
    The trainable logs an epoch to MLflow, then reports its checkpoint to Tune: a kill -9 of
    the trial worker in between retries the trial from the checkpoint before (so that epoch
    runs again), and it must not be logged again (one point per step) nor an epoch skipped."""
    # Enough epochs that the kill lands mid-trial: status.json lags Tune by up to 1 s, and on
    # SMALL_DATA an idle machine trains a dozen epochs or more within that lag.
    epochs = 40
    spec = _write_spec(tmp_path, "worker", {
        **SMALL_DATA, "template.training.epochs": epochs, "seeds": 1, "alpha": [1],
        "loss_stacks": ["raw_token_weighted"], "budget.max_failures_per_trial": 2,
    })
    process = _sweep(tmp_path, spec, "wk1")
    status_path = tmp_path / "root" / "wk1" / "status.json"
    # What the CLI's Ray tree listens on, looked at every second until the trial has trained
    # two epochs (Ray's daemons come up one by one; the trial's actor comes last).
    sockets: dict[tuple[str, int], str] = {}
    looked = [0.0]

    def trained_two_epochs(status) -> bool:
        done = _epochs_of(status) >= 2
        if done or time.monotonic() - looked[0] >= 1:
            sockets.update(listening([psutil.Process(process.pid), *_ray_processes(process)]))
            looked[0] = time.monotonic()
        return done

    _wait_for(process, status_path, trained_two_epochs, "two epochs of the trial")
    titles = [_title(p) for p in _ray_processes(process)]
    workers = _trial_workers(process)
    assert len(workers) == 1, titles
    # While the trial trains, its actor is Ray's only worker: none was prestarted to idle.
    assert not any(t.startswith("ray::IDLE") for t in titles), titles
    names = set(sockets.values())
    assert any("raylet" in n for n in names) and any("gcs" in n for n in names), names
    wide = {addr: name for addr, name in sockets.items() if not loopback(addr[0])}
    assert not wide, f"listening beyond loopback: {wide}"
    db = tmp_path / "mlflow.db"
    known = _logged_epochs(db)
    deadline = time.time() + 300
    while _logged_epochs(db) == known and time.time() < deadline:  # the next epoch's log
        time.sleep(0.005)
    logged, title = _logged_epochs(db), _title(workers[0])
    workers[0].send_signal(signal.SIGKILL)
    output, _ = process.communicate(timeout=900)
    print(f"{len(sockets)} listening sockets, all on loopback: {sorted(names)}; killed "
          f"{title.strip()!r} (pid {workers[0].pid}) after MLflow held epoch {logged}")
    assert process.returncode == 0, output
    assert logged > known, "the kill must come after an epoch's MLflow log"
    status = read_status(status_path)
    assert (status.state, status.total, status.done, status.failed) == ("succeeded", 1, 1, 0)
    client, _, parents, children = _runs(tmp_path, "quickstart", "wk1")
    assert len(parents) == 1
    assert len(children) == 1, "the retried trial must keep its one run"
    run = children[0]
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "val/loss")]
    assert steps == list(range(1, epochs + 1)), steps
    assert _num_failures(tmp_path, "wk1") == [1], "one failure, retried"
    assert "The actor died unexpectedly" in (_trial_dir(tmp_path, "wk1") / "error.txt").read_text()
    first, retry = _steps_per_worker(_trial_dir(tmp_path, "wk1"))
    print(f"first worker reported {first}, the retry {retry}; "
          f"epochs run twice: {sorted(set(first) & set(retry))}")
    assert first == list(range(1, len(first) + 1)) and len(first) >= 2
    assert retry == list(range(retry[0], epochs + 1))
    # The retry resumed from a checkpoint, not from scratch, and skipped no epoch: from the
    # checkpoint of an epoch the first worker finished (Tune's result.json can miss the last
    # one, whose result the driver had not handled when the worker died).
    assert 2 <= retry[0] <= logged + 1 and logged >= len(first)


def _logged_epochs(db: Path) -> int:
    """The last val/loss step in the MLflow store (read straight from sqlite, fast)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as connection:
            row = connection.execute(
                "SELECT max(step) FROM metrics WHERE key = 'val/loss'").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0] or 0)


def _cohort_runs(db: Path) -> tuple[list[str], int]:
    """The live member runs in the store (run ids, read straight from sqlite) and how many
    val/loss points they hold."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as connection:
            runs = [row[0] for row in connection.execute(
                "SELECT runs.run_uuid FROM runs JOIN tags ON tags.run_uuid = runs.run_uuid "
                "WHERE tags.key = 'ksweep.cohort' AND runs.lifecycle_stage = 'active'")]
            points = connection.execute(
                "SELECT count(*) FROM metrics WHERE key = 'val/loss'").fetchone()[0]
    except sqlite3.Error:
        return [], 0
    return runs, int(points)


@pytest.mark.timeout(1200)
def test_kill9_of_a_cohort_worker_before_its_first_checkpoint_leaves_one_run_per_member(tmp_path):
    """A cohort's member runs are made by its metric writer while the first epoch trains: a
    kill -9 of the trial worker then (the runs made, no epoch logged, no checkpoint) leaves
    them behind; the retry starts afresh, deletes them and trains every member into one run."""
    # Three members (not two) and 4,096 examples: a long first train pass holds the window between
    # the runs and the first logged epoch open for seconds; one epoch, so the retry trains once.
    members, epochs = 3, 1
    spec = _write_spec(tmp_path, "cohort-kill", {
        "template.data.train_size": 4096, "template.data.val_size": 128,
        "template.data.test_size": 128, "template.training.epochs": epochs, "seeds": members,
        "alpha": [1], "loss_stacks": ["raw_token_weighted"], "budget.max_failures_per_trial": 2,
        "budget.max_concurrent_trials": 1, "resources.cohort_size": members,
    })
    # Through a writer process (three members are below its default threshold): the kill
    # takes the child, and the runs it made, down with the trial worker.
    process = _sweep(tmp_path, spec, "ck1", env={MIN_RUNS_ENV: "2"})
    db = tmp_path / "mlflow.db"
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        made, points = _cohort_runs(db)
        if len(made) == members or points:
            break
        time.sleep(0.02)
    (worker,) = _trial_workers(process)
    writers = [child for child in worker.children() if "workers.tracking.writer_process" in child.cmdline()]
    worker.send_signal(signal.SIGKILL)
    assert len(made) == members and points == 0, ("the kill missed the window", made, points)
    assert len(writers) == 1, "the cohort's runs were made by its writer process"
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output
    status = read_status(tmp_path / "root" / "ck1" / "status.json")
    assert (status.state, status.total, status.done, status.failed) == ("succeeded", members, members, 0)
    assert _num_failures(tmp_path, "ck1") == [1], "one failure, retried"
    client, _, _, children = _runs(tmp_path, "quickstart", "ck1")
    assert len(children) == members
    assert len({c.data.tags["ksweep.trial_id"] for c in children}) == members
    assert not {c.info.run_id for c in children} & set(made), "the killed try's runs were deleted"
    for run_id in made:
        assert client.get_run(run_id).info.lifecycle_stage == "deleted"
    for child in children:
        assert child.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val/loss")]
        assert steps == list(range(1, epochs + 1)), steps


@pytest.mark.timeout(1500)
def test_kill9_of_the_whole_local_ray_ends_the_driver_and_a_rerun_resumes(tmp_path):
    # 4 rows, 3 trials (uniform once for its two alphas), one at a time in one reused actor
    # (num_cpus=1); the whole local Ray killed amid the second trial, then the rerun's driver
    # killed with its Ray (kill -9 of its process group) amid the third, and a third run ends the
    # sweep. The lone path (trials that end one by one) pins cohort_size 1: auto would train the
    # 3 trials as one cohort (its kill -9: test_cohort_sweep.py). 16 epochs of the full data keep
    # a trial in flight for seconds on a loaded machine: the kills need it mid-way.
    epochs = 16
    spec = _write_spec(tmp_path, "ray", {"template.training.epochs": epochs, "seeds": 1,
                                         "alpha": [1, 2], "loss_stacks": ["uniform", "raw_plus_ncc"],
                                         "budget.max_concurrent_trials": 1,
                                         "resources.cohort_size": 1})
    # The driver's core worker gives up on a lost GCS after 10 s, not Ray's 60 s (which would be
    # most of this test's wall time); what is asserted below is the same.
    process = _sweep(tmp_path, spec, "rk1", env=GCS_RECONNECT_ENV, num_cpus=1)
    status_path = tmp_path / "root" / "rk1" / "status.json"
    _wait_for(process, status_path, lambda s: s.done >= 1 and any(
        t["state"] == "running" and (t.get("epochs") or 0) >= 2 for t in s.trials),
        "a completed trial and a second two epochs in")
    # Kill once Tune's saved state names a checkpoint of the trial in flight, all of them on disk:
    # killed before that save, the trial would restart afresh (not this test's case).
    (in_flight_id,) = [t["trial_id"] for t in read_status(status_path).trials if t["state"] == "running"]
    wait_restorable(tmp_path / "root" / "rk1" / "tune", limit_s=120, naming=in_flight_id)
    ray = _ray_processes(process)
    titles = sorted({_title(p).split()[0].rsplit("/", 1)[-1] for p in ray if _title(p)})
    print(f"killing {len(ray)} Ray processes: {titles}")
    assert any("gcs_server" in t for t in titles) and any("raylet" in t for t in titles), titles
    killed_at = time.monotonic()
    for proc in ray:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    try:
        output, _ = process.communicate(timeout=600)  # the bound: the driver must not hang
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output = process.communicate()[0]
        pytest.fail(f"the driver hung after its Ray was killed: {output[-3000:]}")
    print(f"driver ended {time.monotonic() - killed_at:.0f} s after the kill, "
          f"rc {process.returncode}; its last output:\n{output[-1500:]}")
    status = read_status(status_path)
    print(f"status after the kill: {status.state} {status.error!r}")
    _, _, _, before = _runs(tmp_path, "quickstart", "rk1")
    finished_before = {c.info.run_id for c in before if c.info.status == "FINISHED"}
    print(f"runs before the rerun: {[(c.data.tags['ksweep.trial_id'], c.info.status) for c in before]}")
    # Ray's core worker ends the driver itself (exit status 1) once it cannot reach the GCS
    # (gcs_rpc_server_reconnect_timeout_s, GCS_RECONNECT_ENV): no Python code runs, so status.json
    # keeps saying running; the service's reconcile sees the driver gone (row 5a).
    assert process.returncode != 0 or status.state == "failed"
    assert "Failed to connect to GCS" in output or "GCS" in (status.error or ""), output[-3000:]
    assert len(finished_before) >= 1
    in_flight = {c.data.tags["ksweep.trial_id"]: c.info.run_id for c in before
                 if c.info.status != "FINISHED"}
    restarted = _sweep(tmp_path, spec, "rk1", num_cpus=1)
    # The rerun's driver and its local Ray die together once Tune has recorded a second trial
    # done and saved its state: the next run must again not re-run or duplicate a finished one.
    _wait_for(restarted, status_path, lambda s: s.done >= 2, "a second completed trial")
    time.sleep(2.5)  # let Tune save its experiment state (TUNE_GLOBAL_CHECKPOINT_S = 2)
    # On a quiet machine the rerun may finish the last trial first: then there is nothing to
    # kill, and the third run below must find every trial done and re-run none.
    tune_folder = tmp_path / "root" / "rk1" / "tune"
    if wait_restorable(tune_folder, limit_s=120, driver=restarted):
        with contextlib.suppress(ProcessLookupError):  # it may end between the check and here
            os.killpg(restarted.pid, signal.SIGKILL)
    if restarted.wait() == -signal.SIGKILL:
        # As a kill during Tune's copy of its save leaves it (it did in a suite run): the rerun's
        # own state file empty. The third run must put back the rerun's save, not the first
        # run's (which Tune's restore had carried along and copied over the rerun's backup).
        max(tune_folder.glob(STATE_PATTERN)).write_bytes(b"")
    _, _, _, before_second = _runs(tmp_path, "quickstart", "rk1")
    finished_second = {c.info.run_id for c in before_second if c.info.status == "FINISHED"}
    assert finished_before <= finished_second and len(finished_second) >= 2
    rerun = _sweep(tmp_path, spec, "rk1", num_cpus=1)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output
    client, _, parents, children = _runs(tmp_path, "quickstart", "rk1")
    (trial_id,) = in_flight
    (folder,) = (tmp_path / "root" / "rk1" / "tune").glob(f"train_sweep_trial_{trial_id}_*")
    print(f"the trial in flight, per (re)start: {_steps_per_worker(folder)}")
    assert len(parents) == 1, "the resumed driver must reuse the parent run"
    trial_ids = [c.data.tags["ksweep.trial_id"] for c in children]
    assert len(children) == 3 and len(set(trial_ids)) == 3, trial_ids
    assert finished_before <= {c.info.run_id for c in children}
    # The trial in flight resumed from its checkpoint into its own run.
    assert len(in_flight) == 1, in_flight
    assert set(in_flight.values()) <= {c.info.run_id for c in children}, in_flight
    assert finished_second <= {c.info.run_id for c in children}
    for child in children:
        assert child.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val/loss")]
        assert steps == list(range(1, epochs + 1)), (child.data.tags["ksweep.trial_id"], steps)
        assert client.list_artifacts(child.info.run_id, "plots") == []  # lone, trial_plots off
        for finished, runs in ((finished_before, before), (finished_second, before_second)):
            if child.info.run_id in finished:  # not re-run: untouched since that kill
                old = next(c for c in runs if c.info.run_id == child.info.run_id)
                assert child.info.end_time == old.info.end_time
    status = read_status(status_path)
    assert (status.state, status.done, status.failed) == ("succeeded", 3, 0)


@pytest.fixture
def tiny_sweep_root(tmp_path):
    """A 2 MiB tmpfs as the sweep root (one trial checkpoint is about 1.4 MiB)."""
    root = tmp_path / "root"
    root.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(root)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield root
    if subprocess.run(["umount", str(root)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(root)], check=True)  # a lingering Ray process


@pytest.mark.timeout(900)
def test_disk_full_under_the_sweep_root_fails_the_sweep_with_the_reason(tmp_path, tiny_sweep_root):
    # The second checkpoint fills the disk: 3 epochs reach it; no retry (one would fail the same way).
    spec = _write_spec(tmp_path, "full", {
        **SMALL_DATA, "template.training.epochs": 3, "seeds": 1, "alpha": [1],
        "loss_stacks": ["raw_token_weighted"], "budget.max_failures_per_trial": 0,
    })
    process = _sweep(tmp_path, spec, "df1")  # MLflow's store is in tmp_path, off the tmpfs
    try:
        output, _ = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output = process.communicate()[0]
        pytest.fail(f"the sweep hung on a full disk: {output[-3000:]}")
    status = read_status(tiny_sweep_root / "df1" / "status.json")
    frames = [line.strip("│ ") for line in output.splitlines() if ".py:" in line and " in " in line]
    print(f"rc {process.returncode}; status {status and (status.state, status.error)}; "
          f"the driver's traceback: {frames}\n{output[-600:]}")
    _, _, parents, children = _runs(tmp_path, "quickstart", "df1")
    runs = [(r.data.tags.get(RUN_KIND_TAG), r.info.status, r.data.tags.get(FAILURE_TAG))
            for r in parents + children]
    print(f"runs: {runs}")
    assert process.returncode != 0 or status.state == "failed"
    reason = output + (status.error or "" if status else "")
    assert "No space left" in reason or "ENOSPC" in reason, reason[-3000:]
    # MLflow lives off the full disk: every run ends FAILED, with the reason.
    assert len(parents) == 1 and parents[0].info.status == "FAILED"
    assert "No space left" in parents[0].data.tags[FAILURE_TAG]
    assert len(children) == 1 and children[0].info.status == "FAILED"
    assert "No space left" in children[0].data.tags[FAILURE_TAG]

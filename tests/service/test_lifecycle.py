"""Real sweeps through the service: local drivers, local Ray, a sqlite MLflow store."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from conftest import auth, tiny_spec
from mlflow.tracking import MlflowClient
from sweep_checks import wait_for_sweep

from service.orchestrator.launchers import LocalLauncher, _group_exists
from service.orchestrator.supervisor import Supervisor
from service.settings import Settings
from service.store.db import SweepRow
from service.store.queries import Store
from workers.contract import RUN_KIND_SWEEP, RUN_KIND_TAG, RUN_KIND_TRIAL

pytestmark = pytest.mark.slow


def _wait(client, sweep_id: str, until, timeout_s: float = 400.0, what: str = "") -> dict:
    return wait_for_sweep(lambda: client.get(f"/sweeps/{sweep_id}").json(), until,
                          what or str(until), timeout_s)


def _driver_pid(sweep: dict) -> int:
    handle = sweep["driver"]["handle"]
    assert handle.startswith("pid:"), handle
    return int(handle[4:].split("@")[0])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def _sweep_runs(tracking_uri: str, sweep: dict):
    client = MlflowClient(tracking_uri=tracking_uri)
    runs = client.search_runs([sweep["mlflow"]["experiment_id"]],
                              filter_string=f"tags.`ksweep.sweep_id` = '{sweep['id']}'")
    parents = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RUN_KIND_SWEEP]
    children = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RUN_KIND_TRIAL]
    return client, parents, children


def cancel_and_check_stopped(client, sweep_id: str, driver: int, owner: str) -> dict:
    """Cancel as ``owner``: the driver and its whole process group (local Ray, trial workers)
    are gone and the sweep stays cancelled. Returns the sweep as it is afterwards."""
    cancelled = client.post(f"/sweeps/{sweep_id}/cancel", headers=auth(owner))
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert not _alive(driver) and not _group_exists(driver)
    time.sleep(2)  # the supervisor must not restart a cancelled sweep
    after = client.get(f"/sweeps/{sweep_id}").json()
    assert after["state"] == "cancelled" and after["driver"]["attempts"] == 1
    return after


def test_sweep_survives_api_kill9_then_queued_sweep_runs_and_cancel_keeps_finished(make_service, tmp_path):
    service = make_service(KSWEEP_MAX_CONCURRENT_SWEEPS="1")
    tracking_uri = service.env["MLFLOW_TRACKING_URI"]
    client = service.client()
    # The first sweep runs its 3 trials one at a time, so a finished trial is seen while the
    # sweep still runs (as one cohort its members end together, and with per-trial PNGs off by
    # default the sweep could end between two polls).
    first = client.post("/sweeps", json=tiny_spec("first", **{
        "budget.max_concurrent_trials": 1, "resources.cohort_size": 1}),
        headers=auth("alice")).json()
    # The second sweep tests the lone path's cancel (trials that end one by one), so it pins
    # cohort_size 1 (auto would train its 3 trials as one cohort: test_cohort_cancel.py).
    second = client.post("/sweeps", json=tiny_spec("second", **{
        "budget.max_concurrent_trials": 1, "template.training.epochs": 4,
        "resources.cohort_size": 1}), headers=auth("bob")).json()

    # One sweep at a time: the second waits in the queue while the first runs.
    running = _wait(client, first["id"], lambda s: s["state"] == "running" and s["counters"]["done"] >= 1,
                    what="a finished trial of the first sweep")
    assert client.get(f"/sweeps/{second['id']}").json()["state"] == "queued"
    driver = _driver_pid(running)

    # kill -9 the API mid-sweep: the driver (its own process group) keeps going.
    service.kill9()
    assert _alive(driver)
    service.start()
    client = service.client()
    reattached = client.get(f"/sweeps/{first['id']}").json()
    assert reattached["driver"]["handle"] == running["driver"]["handle"]  # re-attached, not restarted
    assert reattached["driver"]["attempts"] == 1

    done = _wait(client, first["id"], lambda s: s["state"] in ("succeeded", "failed"), what="end")
    assert done["state"] == "succeeded", done
    # tiny_spec: 4 rows, 3 trials (uniform is one trial at both alphas).
    assert done["counters"] == {"total": 3, "pending": 0, "running": 0, "done": 3, "failed": 0,
                                "stopped": 0}
    assert done["progress"] == 1.0 and done["finished_at"] and done["eta_seconds"] == 0.0
    assert done["best"]["metric"] == "val/latent_nmi" and done["best"]["value"] is not None
    assert done["mlflow"]["ui_url"].endswith(
        f"#/experiments/{done['mlflow']['experiment_id']}/runs/{done['mlflow']['parent_run_id']}")
    deadline = time.monotonic() + 60  # the driver exits once it has shut its Ray down
    while _alive(driver) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(driver)

    trials = client.get(f"/sweeps/{first['id']}/trials", params={"limit": 3}).json()
    assert trials["total"] == 3 and len(trials["items"]) == 3
    rest = client.get(f"/sweeps/{first['id']}/trials", params={"offset": 3}).json()["items"]
    items = trials["items"] + rest
    assert {(t["config"]["alpha"], t["config"]["loss_stack"]) for t in items} == {
        (0.0, "uniform"), (0.0, "raw_plus_ncc"), (1.0, "raw_plus_ncc")}
    assert all(t["state"] == "done" and t["epochs"] == 3 for t in items)
    assert all(0.0 <= t["metrics"]["val/latent_nmi"] <= 1.0 for t in items)
    assert all(t["metrics"]["val/kappa_mean"] == pytest.approx(1.0) for t in items
               if t["config"]["alpha"] == 0.0)
    assert all(t["metrics"]["val/kappa_mean"] > 1.0 for t in items if t["config"]["alpha"] == 1.0)

    report = client.get(f"/sweeps/{first['id']}/report").json()
    assert report["sweep_id"] == first["id"] and report["counts"] == {"done": 3}
    assert report["dedup"] == {"trials_requested": 4, "trials_run": 3, "trials_saved_by_dedup": 1,
                               "trials_reused": 0}
    nmi = [c for c in report["cells"] if c["metric"] == "latent_nmi" and c["kind"] == "all"]
    assert {(c["alpha"], c["loss_stack"]) for c in nmi} == {
        (a, s) for a in (0.0, 1.0) for s in ("uniform", "raw_plus_ncc")}
    assert report["best"][0]["metric"] == "latent_nmi"

    mlflow, parents, children = _sweep_runs(tracking_uri, done)
    assert len(parents) == 1 and parents[0].info.run_id == done["mlflow"]["parent_run_id"]
    assert parents[0].info.status == "FINISHED"
    assert {a.path for a in mlflow.list_artifacts(parents[0].info.run_id)} >= {"report.json", "report.md"}
    # No trial has two runs, though the API died mid-sweep.
    per_trial = Counter(r.data.tags["ksweep.trial_id"] for r in children)
    assert len(per_trial) == 3 and set(per_trial.values()) == {1}
    assert {r.info.run_id for r in children} == {t["mlflow_run_id"] for t in items}
    for run in children:
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.info.status == "FINISHED"
        assert [m.step for m in mlflow.get_metric_history(run.info.run_id, "val/latent_nmi")] == [1, 2, 3]

    # The queued sweep starts once the first ends; cancel it after its first trial.
    mid = _wait(client, second["id"], lambda s: s["state"] == "running" and s["counters"]["done"] >= 1,
                what="a finished trial of the second sweep")
    second_driver = _driver_pid(mid)
    forbidden = client.post(f"/sweeps/{second['id']}/cancel", headers=auth("alice"))
    assert forbidden.status_code == 403
    after = cancel_and_check_stopped(client, second["id"], second_driver, "bob")
    assert 1 <= after["counters"]["done"] < after["counters"]["total"]
    _, parents, children = _sweep_runs(tracking_uri, after)
    finished = [r for r in children if r.info.status == "FINISHED"]
    assert len(finished) >= 1  # completed trials keep their results
    for run in finished:
        assert len(mlflow.get_metric_history(run.info.run_id, "val/loss")) == 4
    assert all(r.info.status in ("FINISHED", "KILLED") for r in [*parents, *children])
    assert parents[0].info.status == "KILLED"
    again = client.post(f"/sweeps/{second['id']}/cancel", headers=auth("bob"))
    assert again.status_code == 200 and again.json()["state"] == "cancelled"
    client.close()


def _running_row(store: Store, sweep_id: str, handle: str, attempts: int, spec: dict) -> None:
    with store.session.begin() as session:
        session.add(SweepRow(id=sweep_id, owner="alice", name="orphan", state="running", spec=spec,
                             request_hash="x", total=4, pending=4, attempts=attempts,
                             launcher="local", driver_handle=handle))


def test_reconcile_restarts_dead_drivers_up_to_the_limit(tmp_path):
    settings = Settings(sweep_root=tmp_path / "root", max_driver_restarts=2,
                        mlflow_tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    store = Store(settings.store_url)
    launcher = LocalLauncher(settings)
    dead = f"pid:{2**22 + 12345}@{os.uname().nodename}"
    # A driver that died at its last allowed attempt: the sweep fails, naming the reason.
    _running_row(store, "exhausted", dead, attempts=3, spec=tiny_spec())
    # One that may be restarted: a new driver starts (attempt 2). Its stored spec is broken on
    # purpose, so the restarted driver fails it at once instead of training.
    _running_row(store, "restartable", dead, attempts=1, spec={"name": "broken", "alpha": "many"})
    supervisor = Supervisor(settings, store, launcher)
    supervisor.tick()
    try:
        _check_restarts(store, tmp_path, dead)
    finally:
        handle = store.get_sweep("restartable").driver_handle
        launcher.stop("restartable", handle, grace_s=1.0)
        store.close()


def _check_restarts(store: Store, tmp_path: Path, dead: str) -> None:
    exhausted = store.get_sweep("exhausted")
    assert exhausted.state == "failed"
    assert "died 3 times" in exhausted.error and "KSWEEP_MAX_DRIVER_RESTARTS=2" in exhausted.error
    restarted = store.get_sweep("restartable")
    assert restarted.attempts == 2 and restarted.driver_handle != dead
    deadline = time.monotonic() + 60
    while store.get_sweep("restartable").state == "running" and time.monotonic() < deadline:
        time.sleep(0.3)
    final = store.get_sweep("restartable")
    assert final.state == "failed" and "stored spec is invalid" in final.error
    assert (tmp_path / "root" / "restartable" / "driver-2.log").is_file()

"""What every row of the fault matrix checks once its sweep has ended: the sweep succeeded,
each completed trial has exactly one FINISHED MLflow trial run with one point per epoch, and
the store's counters and trial records agree with MLflow; and the waits the rows share."""

from __future__ import annotations

import time
from collections import Counter

import httpx
from mlflow.tracking import MlflowClient

from workers.contract import RUN_KIND_SWEEP, RUN_KIND_TAG, RUN_KIND_TRIAL

PER_EPOCH_KEYS = ("val/loss", "val/latent_nmi", "train/loss")


def wait_until(predicate, timeout_s: float, what: str):
    """``predicate()``'s first true value, asked every 0.3 s for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_sweep(fetch, until, what: str, timeout_s: float, state_of=lambda s: s["state"],
                   every_s: float = 0.5):
    """``fetch()``'s first sweep for which ``until(sweep)`` holds, asked every ``every_s``. An
    ended sweep cannot meet a condition it has not met: it fails at once, not at the timeout."""
    deadline = time.monotonic() + timeout_s
    sweep = None
    while time.monotonic() < deadline:
        sweep = fetch()
        if until(sweep):
            return sweep
        assert state_of(sweep) not in ("succeeded", "failed", "cancelled"), (
            f"the sweep ended before {what}: {sweep}")
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}: {sweep}")


def poll(client: httpx.Client, path: str, until, timeout_s: float, what: str) -> dict:
    """GET ``path`` until ``until(body)``; answers other than 200 (a store that is down) and
    refused connections are waited through."""
    deadline = time.monotonic() + timeout_s
    body: dict = {}
    while time.monotonic() < deadline:
        try:
            response = client.get(path)
            if response.status_code == 200:
                body = response.json()
                if until(body):
                    return body
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {body}")


def trials_of(client: httpx.Client, sweep_id: str) -> list[dict]:
    return client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 100}).json()["items"]


def check_consistent(client: httpx.Client, tracking_uri: str, sweep: dict, trials: int,
                     epochs: int) -> dict[str, list]:
    """Asserts the guarantees above; returns each trial run's per-epoch metric points by run id."""
    assert sweep["state"] == "succeeded", sweep
    assert sweep["counters"] == {"total": trials, "pending": 0, "running": 0, "done": trials,
                                 "failed": 0, "stopped": 0}
    records = trials_of(client, sweep["id"])
    assert len(records) == trials
    assert all(t["state"] == "done" and t["epochs"] == epochs for t in records), records
    mlflow = MlflowClient(tracking_uri=tracking_uri)
    runs = mlflow.search_runs([sweep["mlflow"]["experiment_id"]],
                              filter_string=f"tags.`ksweep.sweep_id` = '{sweep['id']}'")
    parents = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RUN_KIND_SWEEP]
    children = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RUN_KIND_TRIAL]
    assert [p.info.run_id for p in parents] == [sweep["mlflow"]["parent_run_id"]]
    assert parents[0].info.status == "FINISHED"
    assert {a.path for a in mlflow.list_artifacts(parents[0].info.run_id)} >= {"report.json",
                                                                             "report.md"}
    # One run per trial, the one the store names, FINISHED.
    assert Counter(r.data.tags["ksweep.trial_id"] for r in children) == Counter(
        {t["trial_id"]: 1 for t in records})
    assert {r.info.run_id for r in children} == {t["mlflow_run_id"] for t in records}
    assert sum(r.info.status == "FINISHED" for r in children) == sweep["counters"]["done"]
    points = {}
    for run in children:
        assert run.info.status == "FINISHED", run.info
        for key in PER_EPOCH_KEYS:
            history = mlflow.get_metric_history(run.info.run_id, key)
            assert sorted(p.step for p in history) == list(range(1, epochs + 1)), (key, history)
        points[run.info.run_id] = mlflow.get_metric_history(run.info.run_id, "val/loss")
    report = client.get(f"/sweeps/{sweep['id']}/report").json()
    assert report["counts"] == {"done": trials}
    return points

"""Cancel of a cohort sweep through the real service (mirrors the lone-trial cancel in
test_lifecycle.py): local driver, local Ray, a sqlite MLflow store."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import auth, tiny_spec
from test_lifecycle import _driver_pid, _sweep_runs, _wait, cancel_and_check_stopped

from sweeps.status import STATE_TAG
from sweeps.tune.member_runs import COHORT_TAG
from workers.contract import FAILURE_TAG, STOPPED_EARLY_TAG

pytestmark = pytest.mark.slow

# The kill window: the second cohort is cancelled after its first epoch, before its last. An
# epoch takes about 0.3 s here and the progress the test polls can be 1.5 s old or more, so the second
# cohort trains for about 8 s (5 epochs left a window of about 1.2 s, which a run once missed).
EPOCHS = 30


def test_cancel_of_a_cohort_sweep_ends_every_member_run(make_service):
    service = make_service()
    tracking_uri = service.env["MLFLOW_TRACKING_URI"]
    client = service.client()
    # uniform and raw_plus_ncc at alpha 1 on two seeds: 4 trials, in two cohorts of 2 that run
    # one after the other.
    sweep = client.post("/sweeps", json=tiny_spec("cohorts", **{
        "alpha": [1], "seeds": 2, "resources.cohort_size": 2, "budget.max_concurrent_trials": 1,
        "template.training.epochs": EPOCHS}), headers=auth("bob")).json()
    assert sweep["counters"]["total"] == 4

    def second_cohort_trains(state: dict) -> bool:
        if state["state"] != "running" or state["counters"]["done"] < 2:
            return False
        items = client.get(f"/sweeps/{state['id']}/trials", params={"limit": 100}).json()["items"]
        return sum(t["state"] == "running" and t["epochs"] >= 1 for t in items) == 2

    # Cancel once the first cohort has ended and the second has reported an epoch.
    mid = _wait(client, sweep["id"], second_cohort_trains, what="the second cohort training")
    after = cancel_and_check_stopped(client, sweep["id"], _driver_pid(mid), "bob")
    counters = after["counters"]
    # A cohort's members end together (same epochs, no early stopping): 2 done, 2 not.
    assert counters["total"] == 4 and counters["done"] == 2, counters

    mlflow, parents, children = _sweep_runs(tracking_uri, after)
    assert len(parents) == 1 and parents[0].info.status == "KILLED"
    assert all(r.info.status != "RUNNING" for r in children)
    per_trial = Counter(r.data.tags["ksweep.trial_id"] for r in children)
    assert set(per_trial.values()) == {1}  # no member has two runs
    assert len({r.data.tags[COHORT_TAG] for r in children}) == 2  # both cohorts opened runs
    finished = [r for r in children if r.info.status == "FINISHED"]
    # The counters agree with MLflow: the done members are exactly the FINISHED runs, each
    # with its whole history, none marked as stopped early.
    assert len(finished) == counters["done"]
    for run in finished:
        assert STOPPED_EARLY_TAG not in run.data.tags
        assert [m.step for m in mlflow.get_metric_history(run.info.run_id, "val/loss")] == list(
            range(1, EPOCHS + 1))
    # Every other member's run ended with its reason: KILLED by the cancel, or FAILED.
    for run in children:
        if run.info.status == "KILLED":
            assert run.data.tags[STATE_TAG] == "cancelled"
        elif run.info.status == "FAILED":
            assert run.data.tags[FAILURE_TAG]
    assert len([r for r in children if r.info.status == "KILLED"]) >= 1
    assert len(children) == 4

    items = client.get(f"/sweeps/{sweep['id']}/trials", params={"limit": 100}).json()["items"]
    assert len(items) == 4  # members are trials in the service's list
    done = {t["mlflow_run_id"] for t in items if t["state"] == "done"}
    assert done == {r.info.run_id for r in finished}
    # The members cancelled mid-cohort: not done, and their runs are the KILLED ones.
    assert {t["mlflow_run_id"] for t in items if t["state"] != "done"} == {
        r.info.run_id for r in children if r.info.status in ("KILLED", "FAILED")}
    again = client.post(f"/sweeps/{sweep['id']}/cancel", headers=auth("bob"))
    assert again.status_code == 200 and again.json()["state"] == "cancelled"
    client.close()

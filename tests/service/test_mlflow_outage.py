"""Fault matrix row 2: the MLflow tracking server stopped for 60 s mid-sweep, then started
again on the same port and store. The sweep runs over the service (``ksweep serve``, a local
driver, a local Ray) and logs to a real ``mlflow server`` (sqlite store, served artifacts).

The client's own retries are cut to one quick retry (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=1``),
so the outage outlasts them many times over and only ksweep's retries and buffering
(``workers/tracking/retry.py``) can carry the sweep through it."""

from __future__ import annotations

import time

import pytest
from conftest import auth, tiny_spec
from mlflow.tracking import MlflowClient
from sweep_checks import check_consistent, poll, trials_of

from sweeps.status import STATE_TAG, counter_tag
from tests.support.groups import exclusive
from tests.support.outage_servers import MlflowServer

pytestmark = [pytest.mark.slow, exclusive]  # the MLflow server stopped and restarted

OUTAGE_S = 60
# The outage begins once both trials logged 2 epochs (a tiny epoch takes ~0.5-1 s here), so
# 14 more keep them training well into it; then they wait, idle, for the server.
EPOCHS = 16


@pytest.fixture
def mlflow_server(tmp_path):
    folder = tmp_path / "mlflow-server"
    folder.mkdir()
    server = MlflowServer(folder)
    server.start()
    yield server
    server.stop()


def test_a_60s_mlflow_outage_mid_sweep_loses_no_epoch(make_service, mlflow_server):
    service = make_service(
        MLFLOW_TRACKING_URI=mlflow_server.url, KSWEEP_MLFLOW_UI_URL=mlflow_server.url,
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1",
        MLFLOW_HTTP_REQUEST_TIMEOUT="20")
    client = service.client()
    spec = tiny_spec("mlflow-outage", alpha=[1], loss_stacks=["uniform", "raw_plus_ncc"],
                     **{"template.training.epochs": EPOCHS, "budget.max_concurrent_trials": 2})
    sweep_id = client.post("/sweeps", json=spec, headers=auth("alice")).json()["id"]
    # Both trials are training and MLflow holds their first epochs.
    poll(client, f"/sweeps/{sweep_id}", lambda s: s["state"] == "running", 120, "running")
    started = time.monotonic()
    while True:
        trials = trials_of(client, sweep_id)
        if len(trials) == 2 and all(t["state"] == "running" and t["epochs"] >= 2 for t in trials):
            break
        assert time.monotonic() - started < 300, trials
        time.sleep(0.3)

    mlflow_server.stop()
    down_ms = int(time.time() * 1000)
    at_stop = {t["trial_id"]: t["epochs"] for t in trials_of(client, sweep_id)}
    assert all(epochs < EPOCHS for epochs in at_stop.values()), at_stop  # the outage is mid-sweep
    readiness = poll(client, "/readyz", lambda r: r["status"] == "degraded", 30, "degraded")
    assert readiness["checks"]["mlflow"]["ok"] is False
    assert readiness["checks"]["store"]["ok"] is True
    time.sleep(max(0.0, OUTAGE_S - (time.time() * 1000 - down_ms) / 1000))
    during = {t["trial_id"]: t["epochs"] for t in trials_of(client, sweep_id)}
    up_ms = int(time.time() * 1000)
    mlflow_server.start()

    sweep = poll(client, f"/sweeps/{sweep_id}", lambda s: s["state"] in ("succeeded", "failed"),
                 600, "the sweep's end")
    points = check_consistent(client, mlflow_server.url, sweep, trials=2, epochs=EPOCHS)
    # Training went on while the server was down (Tune heard of epochs past those at the stop),
    # and those epochs reached MLflow afterwards, stamped with the time they were logged.
    assert any(during[trial] > epochs for trial, epochs in at_stop.items()), (at_stop, during)
    buffered = [p for history in points.values() for p in history if down_ms < p.timestamp < up_ms]
    assert buffered, "no epoch was logged while the server was down"
    parent = MlflowClient(tracking_uri=mlflow_server.url).get_run(sweep["mlflow"]["parent_run_id"])
    assert parent.data.tags[STATE_TAG] == "succeeded"
    assert parent.data.tags[counter_tag("done")] == "2"
    print(f"outage {OUTAGE_S} s; epochs at the stop {sorted(at_stop.values())}, at the restart "
          f"{sorted(during.values())}; {len(buffered)} val/loss points logged while it was down")
    client.close()

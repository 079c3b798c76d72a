"""Fault matrix row 3: Postgres, the service store, stopped mid-sweep and started again on
the same port and data. The sweep runs over the service (``ksweep serve`` on Postgres, a
local driver, a local Ray, a sqlite MLflow store).

The database stays down from mid-sweep until the driver has finished training and is
retrying its final status, so both kinds of driver write meet the outage: progress reports
(dropped, the next one carries the same counters) and the final status (retried until the
store answers)."""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import auth, tiny_spec
from sweep_checks import check_consistent, poll, trials_of, wait_until

from tests.support.groups import exclusive
from tests.support.outage_servers import Postgres, postgres_bin

pytestmark = [
    pytest.mark.slow,
    exclusive,  # Postgres stopped and restarted mid-sweep
    pytest.mark.skipif(postgres_bin() is None, reason="Postgres binaries not installed "
                       "(apt-get install postgresql)"),
]

EPOCHS = 8
# The driver, every trial trained, waits on the store: first reading the sweep (has it been
# extended meanwhile?), then recording its final status.
END_RETRIES = ("store: reading sweep", "store: final status of sweep")


@pytest.fixture
def postgres(tmp_path):
    server = Postgres(tmp_path)
    server.start()
    yield server
    server.remove()


def _readiness(client: httpx.Client) -> tuple[int, dict]:
    response = client.get("/readyz", timeout=30)
    return response.status_code, response.json()


def test_a_postgres_restart_mid_sweep_loses_nothing(make_service, postgres, tmp_path):
    service = make_service(KSWEEP_DATABASE_URL=postgres.url)
    client = service.client()
    assert _readiness(client)[1]["checks"]["store"]["detail"] == "postgresql"
    spec = tiny_spec("pg-restart", **{"template.training.epochs": EPOCHS,
                                      "budget.max_concurrent_trials": 2})
    sweep_id = client.post("/sweeps", json=spec, headers=auth("alice")).json()["id"]
    # Mid-sweep: the first trials are training (three in all, two at a time).
    poll(client, f"/sweeps/{sweep_id}", lambda s: s["state"] == "running", 120, "running")
    wait_until(lambda: any(t["epochs"] >= 2 for t in trials_of(client, sweep_id)), 300,
           "a trial past its second epoch")
    before = client.get(f"/sweeps/{sweep_id}").json()

    postgres.stop()
    down_at = time.monotonic()
    status, readiness = wait_until(lambda: (r := _readiness(client))[0] == 503 and r, 30, "503")
    assert readiness["status"] == "unready" and readiness["checks"]["store"]["ok"] is False
    assert client.get("/healthz").status_code == 200  # alive, just not ready
    driver_log = tmp_path / "root" / sweep_id / "driver-1.log"
    # Down until the driver has trained every trial and is waiting to record the end.
    wait_until(lambda: any(retry in driver_log.read_text(errors="replace") for retry in END_RETRIES),
           400, "the driver retrying its end (extensions, then final status)")
    postgres.start()
    down_s = time.monotonic() - down_at
    status, readiness = wait_until(lambda: (r := _readiness(client))[0] == 200 and r, 60, "ready")
    assert readiness["checks"]["store"]["ok"] is True

    sweep = poll(client, f"/sweeps/{sweep_id}", lambda s: s["state"] in ("succeeded", "failed"),
                 300, "the sweep's end")
    check_consistent(client, service.env["MLFLOW_TRACKING_URI"], sweep, trials=3, epochs=EPOCHS)
    # The same driver saw it through: no restart spent, and its progress writes did fail.
    assert sweep["driver"]["attempts"] == 1 and sweep["driver"]["handle"] == before["driver"]["handle"]
    log_text = driver_log.read_text(errors="replace")
    assert "could not record progress" in log_text
    assert not (tmp_path / "root" / sweep_id / "driver-2.log").exists()
    print(f"Postgres down {down_s:.0f} s; progress writes lost: {log_text.count('could not record progress')}; final status "
          f"retried {sum(log_text.count(retry) for retry in END_RETRIES)} times; counters before the stop: "
          f"{before['counters']}")
    client.close()

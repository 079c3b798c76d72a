"""Two ``ksweep serve`` processes on one SQLite store: one supervisor at a time (the store's
lease), and a standby that takes over within seconds of a kill -9 of the leader."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from conftest import ServiceProcess, auth, kill_driver_groups, tiny_spec
from test_lifecycle import _sweep_runs, _wait

pytestmark = pytest.mark.slow

LEASE_TTL_S = 3


def _one_trial(name: str) -> dict:
    return tiny_spec(name, alpha=[0], loss_stacks=["uniform"], **{"template.training.epochs": 2})


def _supervisor_check(service: ServiceProcess) -> str:
    with service.client() as client:
        return client.get("/readyz").json()["checks"]["supervisor"]["detail"]


def test_one_supervisor_and_a_takeover_after_kill9_of_the_leader(tmp_path: Path):
    settings = {"KSWEEP_MAX_CONCURRENT_SWEEPS": "2", "KSWEEP_LEASE_TTL_S": str(LEASE_TTL_S),
                "KSWEEP_DRIVER_NUM_CPUS": "1"}
    leader = ServiceProcess(tmp_path, **settings)
    standby = ServiceProcess(tmp_path, **settings)
    standby.log_path = tmp_path / "serve-standby.log"
    try:
        leader.start()
        standby.start()
        assert _supervisor_check(leader).startswith("leading")
        assert _supervisor_check(standby).startswith("standby")
        tracking_uri = leader.env["MLFLOW_TRACKING_URI"]
        # A new connection per request: waits between polls outlast uvicorn's 5 s keep-alive,
        # and a request sent on a connection the server is closing fails.
        client = httpx.Client(base_url=standby.url, timeout=60,
                              limits=httpx.Limits(max_keepalive_connections=0))

        # Submitted through the standby, started by the leader.
        first = client.post("/sweeps", json=_one_trial("first"), headers=auth("alice")).json()
        running = _wait(client, first["id"], lambda s: s["state"] == "running"
                        and (s["driver"]["handle"] or "").startswith("pid:"), what="a driver")
        assert running["driver"]["attempts"] == 1

        # kill -9 the leader; a sweep submitted now stays queued until the standby takes over.
        leader.kill9()
        killed_at = time.monotonic()
        second = client.post("/sweeps", json=_one_trial("second"), headers=auth("bob"))
        assert second.status_code == 201 and second.json()["state"] == "queued", second.text
        second = second.json()
        _wait(client, second["id"], lambda s: s["state"] != "queued", timeout_s=120,
              what="the standby to take over and start the queued sweep")
        took_over_s = time.monotonic() - killed_at
        assert _supervisor_check(standby).startswith("leading")

        ended = [_wait(client, sweep["id"], lambda s: s["state"] in ("succeeded", "failed"),
                       what="end") for sweep in (first, second)]
    finally:
        standby.stop()
        leader.stop()
        kill_driver_groups((tmp_path / "root").resolve())

    for sweep in ended:
        assert sweep["state"] == "succeeded", sweep
        # One driver each: started once, never restarted by the new leader.
        assert sweep["driver"]["attempts"] == 1, sweep
        drivers = sorted(p.name for p in (tmp_path / "root" / sweep["id"]).glob("driver-*.log"))
        assert drivers == ["driver-1.log"], drivers
        _, parents, children = _sweep_runs(tracking_uri, sweep)
        assert len(parents) == 1 and len(children) == 1, (parents, children)
        assert children[0].info.status == "FINISHED"
    log = standby.log_tail(100_000)
    assert log.count("took the lease") == 1, log[-3000:]
    print(f"standby started the queued sweep {took_over_s:.1f} s after the kill (lease {LEASE_TTL_S} s)")

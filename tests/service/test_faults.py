"""Rows of the fault matrix (docs/reliability.md) with real processes on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest
from conftest import ROOT, auth, tiny_spec

from service.store.queries import Store
from tests.support.serve_process import free_port

pytestmark = pytest.mark.slow


def _readiness(client: httpx.Client) -> dict:
    response = client.get("/readyz", timeout=30)
    assert response.status_code in (200, 503), response.text
    return response.json()


def _until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_stopped_dashboard_spends_no_restart_and_readiness_says_degraded(make_service, tmp_path):
    port = free_port()
    jobs_api = subprocess.Popen([sys.executable, "-m", "tests.support.fake_jobs_api", str(port)],
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _until(lambda: _answers(url), 30, "the fake Jobs API")
        # A paused queue: the test itself marks the sweep running with a Ray Job handle, as a
        # leader that submitted the job would have.
        service = make_service(KSWEEP_LAUNCHER="ray", KSWEEP_RAY_JOBS_URL=url,
                               KSWEEP_RAY_JOBS_TIMEOUT_S="1", KSWEEP_MAX_CONCURRENT_SWEEPS="0")
        client = service.client()
        sweep_id = client.post("/sweeps", json=tiny_spec("dashboard"), headers=auth("alice")).json()["id"]
        store = Store(f"sqlite:///{tmp_path / 'root' / 'service.db'}")
        try:
            assert store.mark_launched(sweep_id, launcher="ray", handle=f"ray-job:{sweep_id}",
                                       attempts=1)
        finally:
            store.close()
        _until(lambda: _readiness(client)["status"] == "ready", 30, "ready with the job RUNNING")

        os.kill(jobs_api.pid, signal.SIGSTOP)  # the dashboard hangs: connects, never answers
        degraded = _until(lambda: (r := _readiness(client))["status"] == "degraded" and
                          not r["checks"]["drivers"]["ok"] and r, 60, "degraded readiness")
        assert sweep_id in degraded["checks"]["drivers"]["detail"]
        assert not degraded["checks"]["ray"]["ok"] and degraded["checks"]["store"]["ok"]
        time.sleep(8)  # a dozen polls of unknown health, each timing out after 1 s
        sweep = client.get(f"/sweeps/{sweep_id}").json()
        assert (sweep["state"], sweep["driver"]["attempts"], sweep["error"]) == ("running", 1, None)

        os.kill(jobs_api.pid, signal.SIGCONT)
        _until(lambda: _readiness(client)["status"] == "ready", 60, "ready again")
        sweep = client.get(f"/sweeps/{sweep_id}").json()
        assert sweep["state"] == "running" and sweep["driver"]["attempts"] == 1
        assert sweep["driver"]["handle"] == f"ray-job:{sweep_id}"
        assert "restarting" not in service.log_tail(200_000)
    finally:
        os.kill(jobs_api.pid, signal.SIGCONT)
        jobs_api.kill()
        jobs_api.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/api/version", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_kill9_of_the_api_amid_posts_then_retries_give_one_sweep_per_key(make_service):
    service = make_service(KSWEEP_MAX_CONCURRENT_SWEEPS="0",
                           KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER="1000")
    keys = [f"retry-{uuid.uuid4().hex}" for _ in range(40)]
    first_answers: dict[str, int | str] = {}

    def post(key: str) -> None:
        try:
            with httpx.Client(base_url=service.url, timeout=30) as client:
                response = client.post("/sweeps", json=tiny_spec(f"k{key[-6:]}"),
                                       headers={**auth("alice"), "Idempotency-Key": key})
                first_answers[key] = response.status_code
        except httpx.HTTPError as error:
            first_answers[key] = type(error).__name__

    threads = [threading.Thread(target=post, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    # kill -9 once some POSTs have been answered and others are still in flight.
    _until(lambda: sum(v == 201 for v in first_answers.values()) >= 5, 120, "a few answered POSTs")
    service.kill9()
    for thread in threads:
        thread.join(timeout=60)
    lost = [k for k in keys if first_answers.get(k) != 201]
    service.start()

    ids = {}
    with service.client() as client:
        for key in keys:  # every client retries with its key, answered or not
            response = client.post("/sweeps", json=tiny_spec(f"k{key[-6:]}"),
                                   headers={**auth("alice"), "Idempotency-Key": key})
            assert response.status_code in (200, 201), response.text
            if first_answers.get(key) == 201:
                assert response.status_code == 200  # stored before the kill: replayed
            ids[key] = response.json()["id"]
        total = client.get("/sweeps", params={"limit": 1}).json()["total"]
    assert len(set(ids.values())) == len(keys) == total
    print(f"{len(lost)} of {len(keys)} POSTs had no 201 before the kill; "
          f"every key has exactly one sweep after the retries")

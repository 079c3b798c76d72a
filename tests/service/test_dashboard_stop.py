"""Fault matrix row 7 on a real Ray: ``ray start --head`` on loopback with token auth, a real
Ray Job (a sleeping entrypoint, no training) recorded as a sweep's driver, and the head's own
dashboard process SIGSTOPped, so that the Jobs API the RayJobLauncher asks accepts connections
and never answers. No driver restart may be spent, /readyz says degraded meanwhile and ready
after SIGCONT."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
from conftest import auth, tiny_spec
from sweep_checks import wait_until

from service.orchestrator.launchers import RayJobLauncher
from service.store.queries import Store
from tests.support.groups import exclusive
from tests.support.serve_process import free_port

pytestmark = [pytest.mark.slow, exclusive]  # a Ray head, SIGSTOPped


def _readiness(client: httpx.Client) -> dict:
    response = client.get("/readyz", timeout=30)
    assert response.status_code in (200, 503), response.text
    return response.json()


def _job_status(url: str, headers: dict[str, str], job_id: str) -> str | None:
    try:
        response = httpx.get(f"{url}/api/jobs/{job_id}", headers=headers, timeout=5)
    except httpx.HTTPError:
        return None
    return response.json().get("status") if response.status_code == 200 else None


def _dashboard(head: subprocess.Popen) -> psutil.Process | None:
    """The head's dashboard process (``dashboard/dashboard.py``, not the per-node agent)."""
    for proc in psutil.Process(head.pid).children(recursive=True):
        try:
            if any(arg.endswith("dashboard/dashboard.py") for arg in proc.cmdline()):
                return proc
        except psutil.Error:
            continue
    return None


@pytest.fixture
def ray_head():
    """A real Ray head on loopback with token auth: (dashboard URL, auth headers, env, process)."""
    temp = Path(tempfile.mkdtemp(prefix="krd", dir="/tmp"))  # Ray's socket paths must stay short
    token = secrets.token_hex(32)
    (temp / "token").write_text(token)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_", "KSWEEP_"))}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(temp / "token"),
            "RAY_AUTH_TOKEN": token, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    port = free_port()
    argv = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
            f"--port={free_port()}", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={port}", f"--dashboard-agent-listen-port={free_port()}",
            f"--ray-client-server-port={free_port()}", "--num-cpus=1", "--num-gpus=0",
            "--object-store-memory=100000000", f"--temp-dir={temp / 'ray'}",
            "--min-worker-port=0", "--max-worker-port=0", "--include-dashboard=true"]
    log = open(temp / "ray-head.log", "w")  # noqa: SIM115 (closed at teardown)
    head = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
    try:
        yield url, headers, env, head
    finally:
        # SIGKILL the whole node: a SIGTERM'd `ray start --block` stops its daemons one by one
        # (~30 s), and nothing of this throwaway head is kept.
        for proc in psutil.Process(head.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        head.kill()
        head.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_sigstopped_ray_dashboard_spends_no_restart(ray_head, make_service, tmp_path):
    url, headers, ray_env, head = ray_head
    wait_until(lambda: _answers(url, headers), 180, "the Ray dashboard's Jobs API")
    service = make_service(KSWEEP_LAUNCHER="ray", KSWEEP_RAY_JOBS_URL=url,
                           KSWEEP_RAY_JOBS_TIMEOUT_S="1", KSWEEP_MAX_CONCURRENT_SWEEPS="0",
                           RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=ray_env["RAY_AUTH_TOKEN"])
    client = service.client()
    sweep_id = client.post("/sweeps", json=tiny_spec("dashboard"), headers=auth("alice")).json()["id"]
    # The driver's job as the leader would have submitted it, with a sleeping entrypoint.
    job_id = RayJobLauncher.submission_id(sweep_id, 1)
    submitted = httpx.post(f"{url}/api/jobs/", headers=headers, timeout=30, json={
        "entrypoint": "sleep 900", "submission_id": job_id})
    assert submitted.status_code == 200, submitted.text
    wait_until(lambda: _job_status(url, headers, job_id) == "RUNNING", 180, "the Ray Job RUNNING")
    store = Store(f"sqlite:///{tmp_path / 'root' / 'service.db'}")
    try:
        assert store.mark_launched(sweep_id, launcher="ray", handle=f"ray-job:{job_id}", attempts=1)
    finally:
        store.close()
    wait_until(lambda: _readiness(client)["status"] == "ready", 60, "ready with the job RUNNING")

    dashboard = _dashboard(head)
    assert dashboard is not None, "found no dashboard process under the Ray head"
    dashboard.suspend()  # SIGSTOP: the kernel still accepts connections, nothing answers
    stopped_at = time.monotonic()
    degraded = wait_until(lambda: (r := _readiness(client))["status"] == "degraded" and
                          not r["checks"]["drivers"]["ok"] and r, 60, "degraded readiness")
    print(f"degraded {time.monotonic() - stopped_at:.1f} s after SIGSTOP: {degraded['checks']}")
    assert sweep_id in degraded["checks"]["drivers"]["detail"]
    assert not degraded["checks"]["ray"]["ok"] and degraded["checks"]["store"]["ok"]
    time.sleep(8)  # a dozen polls of unknown health, each timing out after 1 s
    sweep = client.get(f"/sweeps/{sweep_id}").json()
    assert (sweep["state"], sweep["driver"]["attempts"], sweep["error"]) == ("running", 1, None)

    dashboard.resume()  # SIGCONT
    resumed_at = time.monotonic()
    wait_until(lambda: _readiness(client)["status"] == "ready", 60, "ready again")
    print(f"ready {time.monotonic() - resumed_at:.1f} s after SIGCONT")
    sweep = client.get(f"/sweeps/{sweep_id}").json()
    assert sweep["state"] == "running" and sweep["driver"]["attempts"] == 1
    assert sweep["driver"]["handle"] == f"ray-job:{job_id}"
    assert _job_status(url, headers, job_id) == "RUNNING"  # the driver's job was never touched
    assert "restarting" not in service.log_tail(200_000)


def _answers(url: str, headers: dict[str, str]) -> bool:
    try:
        return httpx.get(url + "/api/version", headers=headers, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False

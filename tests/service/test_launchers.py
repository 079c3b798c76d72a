"""Driver health is tri-state: only a driver known dead is restarted.

A real HTTP server on a free port plays the Ray Jobs API (``GET /api/jobs/{id}``); a closed
port and a socket that accepts but never answers play an unreachable and a hung dashboard.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import tiny_spec

from service.orchestrator.launchers import DriverHealth, RayJobLauncher
from service.orchestrator.supervisor import Supervisor
from service.settings import Settings
from service.store.queries import Store
from tests.support.fake_http import answer_json
from tests.support.serve_process import free_port

# Job id -> (HTTP status, body) the fake Jobs API answers.
JOBS = {
    "running": (200, {"status": "RUNNING"}),
    "pending": (200, {"status": "PENDING"}),
    "finished": (200, {"status": "SUCCEEDED"}),
    "failed": (200, {"status": "FAILED"}),
    "sick": (503, {"detail": "dashboard restarting"}),
}


class JobsApi(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the http.server interface)
        job_id = self.path.rsplit("/", 1)[-1]
        status, body = JOBS.get(job_id, (404, {"detail": f"Job {job_id} does not exist"}))
        answer_json(self, status, body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def jobs_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), JobsApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_api() -> Iterator[str]:
    """Accepts connections (the kernel's backlog) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def _launcher(tmp_path: Path, url: str) -> RayJobLauncher:
    return RayJobLauncher(Settings(sweep_root=tmp_path / "root", launcher="ray", ray_jobs_url=url,
                                   ray_jobs_timeout_s=0.5))


@pytest.mark.parametrize(("job_id", "expected"), [
    ("running", DriverHealth.ALIVE), ("pending", DriverHealth.ALIVE),
    ("finished", DriverHealth.DEAD), ("failed", DriverHealth.DEAD),
    ("forgotten-by-a-restarted-head", DriverHealth.LOST), ("sick", DriverHealth.UNKNOWN),
])
def test_ray_job_health_from_the_jobs_api(tmp_path, jobs_api, job_id, expected):
    assert _launcher(tmp_path, jobs_api).health("s1", f"ray-job:{job_id}") == expected


def test_unreachable_or_hung_jobs_api_is_unknown(tmp_path, silent_api):
    closed = f"http://127.0.0.1:{free_port()}"
    assert _launcher(tmp_path, closed).health("s1", "ray-job:running") == DriverHealth.UNKNOWN
    assert _launcher(tmp_path, silent_api).health("s1", "ray-job:running") == DriverHealth.UNKNOWN


def _running_sweep(store: Store, sweep_id: str, handle: str, attempts: int) -> None:
    store.create_sweep(sweep_id=sweep_id, owner="alice", name="tiny", spec=tiny_spec(),
                       request_hash="x", idempotency_key=None, total=4)
    assert store.mark_launched(sweep_id, launcher="ray", handle=handle, attempts=attempts)


@pytest.mark.parametrize("api", ["closed", "silent", "sick"])
def test_unknown_health_spends_no_restart(tmp_path, jobs_api, silent_api, api):
    url = {"closed": f"http://127.0.0.1:{free_port()}", "silent": silent_api, "sick": jobs_api}[api]
    handle = "ray-job:sick" if api == "sick" else "ray-job:s1"
    settings = Settings(sweep_root=tmp_path / "root", launcher="ray", ray_jobs_url=url,
                        ray_jobs_timeout_s=0.5, max_driver_restarts=2)
    store = Store(settings.store_url)
    try:
        _running_sweep(store, "s1", handle, attempts=1)
        supervisor = Supervisor(settings, store, RayJobLauncher(settings))
        for _ in range(3):
            supervisor.tick()
        row = store.get_sweep("s1")
        assert (row.state, row.attempts, row.driver_handle, row.error) == ("running", 1, handle, None)
    finally:
        store.close()


def test_dead_ray_job_is_restarted_and_an_exhausted_one_fails(tmp_path, jobs_api):
    settings = Settings(sweep_root=tmp_path / "root", launcher="ray", ray_jobs_url=jobs_api,
                        ray_jobs_timeout_s=0.5, max_driver_restarts=1)
    store = Store(settings.store_url)
    try:
        _running_sweep(store, "s1", "ray-job:failed", attempts=2)
        Supervisor(settings, store, RayJobLauncher(settings)).tick()
        row = store.get_sweep("s1")
        assert row.state == "failed" and "the driver died 2 times" in row.error
    finally:
        store.close()

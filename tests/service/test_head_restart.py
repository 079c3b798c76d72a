"""A Ray head restarted under a running sweep: its driver is started again, no restart spent.

A real HTTP server on a fixed loopback port plays the head's Jobs API: ``GET /api/version``,
``GET /api/jobs/{id}`` and ``POST /api/jobs/`` (what ``RayJobLauncher`` and Ray's
``JobSubmissionClient`` call). "Restarting the head" shuts that server down (connections
refused: health ``unknown``) and starts a new one on the same port that knows no job, as a
head without GCS fault tolerance comes back (``lost``). The compose smoke does it for real
(``scripts/cluster_faults.py``, ``docker restart`` of the head).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import tiny_spec

from service.orchestrator.launchers import DriverHealth, RayJobLauncher, head_relaunches
from service.orchestrator.supervisor import Supervisor
from service.settings import Settings
from service.store.queries import Store
from tests.support.fake_http import answer_json


class Head:
    """One life of the fake head: the jobs it knows and the submissions it took."""

    def __init__(self, port: int, jobs: dict[str, str]) -> None:
        self.jobs, self.submitted = dict(jobs), []
        head = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: dict) -> None:
                answer_json(self, status, body)

            def do_GET(self) -> None:  # noqa: N802 (the http.server interface)
                if self.path == "/api/version":
                    return self._answer(200, {"version": "4", "ray_version": "2.60.0",
                                              "ray_commit": "x"})
                job_id = self.path.rstrip("/").rsplit("/", 1)[-1]
                if job_id not in head.jobs:
                    return self._answer(404, {"detail": f"Job {job_id} does not exist"})
                return self._answer(200, {"status": head.jobs[job_id]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                sid = body["submission_id"]
                head.submitted.append(sid)
                head.jobs[sid] = "RUNNING"
                return self._answer(200, {"job_id": sid, "submission_id": sid})

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def head_port() -> Iterator[int]:
    first = Head(0, {})  # a free port, kept by the lives that follow (SO_REUSEADDR)
    port = first.server.server_address[1]
    first.stop()
    yield port


def _setup(tmp_path: Path, port: int, window_s: float) -> tuple[Settings, Store, Supervisor]:
    settings = Settings(sweep_root=tmp_path / "root", launcher="ray",
                        ray_jobs_url=f"http://127.0.0.1:{port}", ray_jobs_timeout_s=0.5,
                        max_driver_restarts=2, head_restart_window_s=window_s)
    store = Store(settings.store_url)
    store.create_sweep(sweep_id="s1", owner="alice", name="tiny", spec=tiny_spec(),
                       request_hash="x", idempotency_key=None, total=4)
    assert store.mark_launched("s1", launcher="ray", handle="ray-job:s1", attempts=1)
    return settings, store, Supervisor(settings, store, RayJobLauncher(settings))


def _row(store: Store) -> tuple[str, int, str, str | None]:
    row = store.get_sweep("s1")
    return row.state, row.attempts, row.driver_handle, row.error


def test_a_head_back_within_the_window_gets_the_driver_again_with_no_restart_spent(tmp_path,
                                                                                 head_port):
    settings, store, supervisor = _setup(tmp_path, head_port, window_s=60)
    head = Head(head_port, {"s1": "RUNNING"})
    try:
        supervisor.tick()
        assert _row(store) == ("running", 1, "ray-job:s1", None)
        for life in (1, 2):  # two restarts of the head, each relaunch counted in the handle
            head.stop()
            supervisor.tick()
            supervisor.tick()
            assert supervisor.unknown_health == {"s1": _row(store)[2]}  # /readyz: degraded
            assert _row(store)[:2] == ("running", 1)
            head = Head(head_port, {})  # back, without its jobs
            supervisor.tick()
            assert head.submitted == [f"s1-h{life}"]
            assert _row(store) == ("running", 1, f"ray-job:s1-h{life}", None)
            assert supervisor.unknown_health == {} and supervisor.unknown_since == {}
            supervisor.tick()  # the new job runs: nothing more happens
            assert head.submitted == [f"s1-h{life}"]
        assert head_relaunches(_row(store)[2]) == 2
    finally:
        head.stop()
        store.close()


def test_a_head_away_longer_than_the_window_spends_a_restart(tmp_path, head_port):
    settings, store, supervisor = _setup(tmp_path, head_port, window_s=0)
    supervisor.tick()  # no head at all yet: unknown
    assert _row(store) == ("running", 1, "ray-job:s1", None)
    head = Head(head_port, {})
    try:
        supervisor.tick()
        assert head.submitted == ["s1-r1"]
        assert _row(store) == ("running", 2, "ray-job:s1-r1", None)
    finally:
        head.stop()
        store.close()


def test_a_job_lost_while_the_head_answered_throughout_spends_a_restart(tmp_path, head_port):
    """A 404 never preceded by silence (the job deleted, say) is not a head restart."""
    settings, store, supervisor = _setup(tmp_path, head_port, window_s=60)
    head = Head(head_port, {"s1": "RUNNING"})
    try:
        supervisor.tick()
        del head.jobs["s1"]
        assert RayJobLauncher(settings).health("s1", "ray-job:s1") == DriverHealth.LOST
        supervisor.tick()
        assert head.submitted == ["s1-r1"]
        assert _row(store) == ("running", 2, "ray-job:s1-r1", None)
    finally:
        head.stop()
        store.close()


@pytest.mark.parametrize(("handle", "count"), [
    ("ray-job:s1", 0), ("ray-job:0a1b2c3d4e5f-r1", 0), ("ray-job:0a1b2c3d4e5f-r1-h3", 3),
    ("ray-job:s1-h12", 12), (None, 0), ("pid:12@host", 0),
])
def test_head_relaunches_read_from_the_handle(handle, count):
    assert head_relaunches(handle) == count
    if handle and handle.startswith("ray-job:") and count:
        base = handle.removeprefix("ray-job:").rsplit("-h", 1)[0]
        sweep, _, restart = base.partition("-r")
        attempt = int(restart) + 1 if restart else 1
        assert RayJobLauncher.submission_id(sweep, attempt, count) == handle.removeprefix("ray-job:")

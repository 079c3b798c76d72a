"""A metric write whose answer never comes (a node cut off from the network): given up after
``KSWEEP_MLFLOW_WRITE_TIMEOUT_S``, its connection reset (not closed gracefully, which would
leave its bytes for TCP to deliver once the network heals), sent once (MLflow's client does not
resend it), and retried only after the fence: the run's new writer (``ksweep.writer``) has it
dropped (workers/tracking/wire.py, writer.py). A real socket: a stand-in MLflow server on
loopback that reads the ``log-batch`` request and never answers it."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR
from mlflow.tracking import MlflowClient
from urllib3.connection import HTTPConnection

from tests.support.fake_http import answer_json
from workers.contract import WRITER_TAG
from workers.tracking.wire import LOG_BATCH_ENDPOINT, RESET_ON_CLOSE
from workers.tracking.writer import MetricWriter

NEW_WRITER = "the-retried-trial"


class SilentMlflow(BaseHTTPRequestHandler):
    """``log-batch``: the request is read, never answered; the connection's end is recorded
    (``reset``: an RST came; ``closed``: a FIN). ``runs/get``: the run, claimed by
    :data:`NEW_WRITER` once ``server.claimed`` is set. ``metrics/get-history``: no points."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def handle(self) -> None:
        with contextlib.suppress(ConnectionResetError):  # a kept-alive connection, closed: reset
            super().handle()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server = self.server
        if urlparse(self.path).path != LOG_BATCH_ENDPOINT:
            answer_json(self, 404, {"error_code": "ENDPOINT_NOT_FOUND"})
            return
        server.batches.append(json.loads(body))
        try:
            end = "closed" if self.connection.recv(1) == b"" else "more data"
        except ConnectionResetError:
            end = "reset"
        server.ends.append(end)
        self.close_connection = True

    def do_GET(self) -> None:
        url = urlparse(self.path)
        run_id = parse_qs(url.query).get("run_id", [""])[0]
        if url.path.endswith("/metrics/get-history"):
            answer_json(self, 200, {"metrics": []})
        elif url.path.endswith("/runs/get"):
            tags = (
                [{"key": WRITER_TAG, "value": NEW_WRITER}] if self.server.claimed.is_set() else []
            )
            answer_json(
                self,
                200,
                {
                    "run": {
                        "info": {
                            "run_id": run_id,
                            "run_uuid": run_id,
                            "experiment_id": "0",
                            "status": "RUNNING",
                            "lifecycle_stage": "active",
                        },
                        "data": {"tags": tags},
                    }
                },
            )
        else:
            answer_json(self, 404, {"error_code": "ENDPOINT_NOT_FOUND"})


@pytest.fixture
def silent_mlflow():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SilentMlflow)
    server.daemon_threads = True
    server.batches, server.ends, server.claimed = [], [], threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_every_urllib3_connection_resets_on_close():
    # Set on importing workers.tracking, as MLflow's session copies it.
    assert RESET_ON_CLOSE in HTTPConnection.default_socket_options
    # The option does what it says: a reset, not a FIN, and unsent bytes dropped.
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    client.setsockopt(*RESET_ON_CLOSE)
    accepted, _ = listener.accept()
    client.close()
    with pytest.raises(ConnectionResetError):
        accepted.recv(1)
    accepted.close()
    listener.close()


def test_a_write_without_an_answer_is_given_up_reset_and_dropped_for_the_new_writer(
    silent_mlflow, monkeypatch
):
    monkeypatch.setenv("KSWEEP_MLFLOW_WRITE_TIMEOUT_S", "1")
    # MLflow's own retries: not used for the write, which would otherwise be sent again.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    client = MlflowClient(tracking_uri=f"http://127.0.0.1:{silent_mlflow.server_address[1]}")
    run_id = uuid.uuid4().hex
    writer = MetricWriter(client, run_id, sync_wait_s=0.0, owner="the-cut-off-trial")
    start = time.monotonic()
    writer.submit([[Metric("val/loss", 0.5, 1, 7)]])  # the epoch in flight as the network went
    deadline = time.monotonic() + 10
    while not silent_mlflow.ends and time.monotonic() < deadline:
        time.sleep(0.05)
    given_up_s = time.monotonic() - start
    silent_mlflow.claimed.set()  # meanwhile Ray retried the trial elsewhere; it claimed the run
    writer.submit([[Metric("val/loss", 0.4, 2, 8)]])  # the next epoch, queued behind it
    writer.flush(timeout_s=30)
    assert silent_mlflow.ends == ["reset"]  # its bytes are gone, not left for TCP to deliver
    assert given_up_s < 5
    sent = [int(batch["metrics"][0]["step"]) for batch in silent_mlflow.batches]
    assert sent == [7]  # sent once, never again; epoch 8 dropped too
    assert writer.superseded()


def test_a_refused_write_is_one_transient_attempt(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "5")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens: refused at once
    from workers.tracking.wire import log_batch

    start = time.monotonic()
    with pytest.raises(MlflowException) as error:
        log_batch(
            MlflowClient(tracking_uri=f"http://127.0.0.1:{port}"),
            uuid.uuid4().hex,
            [Metric("val/loss", 0.5, 1, 1)],
            timeout_s=5,
        )
    assert (
        error.value.error_code == "INTERNAL_ERROR" == MlflowException("", INTERNAL_ERROR).error_code
    )
    assert time.monotonic() - start < 2  # no backoff of MLflow's own retries


class ReplyLostOnce:
    """A real client whose first metric ``log_batch`` is written but its reply lost."""

    def __init__(self, client: MlflowClient) -> None:
        self.client, self.lost = client, True

    def __getattr__(self, name):
        return getattr(self.client, name)

    def log_batch(self, run_id, metrics=(), **kwargs):
        self.client.log_batch(run_id, metrics=metrics, **kwargs)
        if metrics and self.lost:
            self.lost = False
            raise MlflowException("API request failed: connection reset", INTERNAL_ERROR)


def test_after_a_failed_write_the_next_batch_asks_for_the_new_writer_first(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run_id = client.create_run(client.create_experiment("fence")).info.run_id
    writer = MetricWriter(ReplyLostOnce(client), run_id, owner="the-cut-off-trial")
    writer.submit([[Metric("val/loss", 0.5, 1, 7)]])  # written, its reply lost: found written
    writer.flush(timeout_s=30)
    client.set_tag(run_id, WRITER_TAG, NEW_WRITER)  # then the retried trial claims the run
    writer.submit([[Metric("val/loss", 0.4, 2, 8)]])  # its first attempt asks first
    writer.flush(timeout_s=30)
    assert [point.step for point in client.get_metric_history(run_id, "val/loss")] == [7]

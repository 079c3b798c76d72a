"""Metric batches written by a child process (workers/log_batch_process.py), as a cohort trial
writes them: a real SQLite store, a real child process, real kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from workers import mlflow_retry
from workers.log_batch_process import LogBatchProcess
from workers.tracking import RunLogger, ensure_experiment


@pytest.fixture
def client(tmp_path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")


@pytest.fixture
def in_child():
    mlflow_retry.write_in_child_process()
    yield mlflow_retry._THREAD
    mlflow_retry.write_in_child_process(False)


def _logger(client: MlflowClient) -> RunLogger:
    experiment_id = ensure_experiment(client, f"child-{uuid.uuid4().hex[:8]}")
    return RunLogger(client, client.create_run(experiment_id).info.run_id, experiment_id, buffered=True)


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((point.step, point.value) for point in client.get_metric_history(run_id, key))


def _wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_deferred_epochs_of_several_runs_are_written_by_the_child_in_order(client, in_child):
    loggers = [_logger(client) for _ in range(3)]
    for step in (1, 2, 3):
        for k, logger in enumerate(loggers):  # a cohort's members: one deferred batch each
            logger.log_metrics({"val/loss": step + k / 10, "val/kl": 2.0 * step}, step=step, wait=False)
    for k, logger in enumerate(loggers):
        logger.settle()
        assert _history(client, logger.run_id, "val/loss") == [(s, pytest.approx(s + k / 10)) for s in (1, 2, 3)]
        assert _history(client, logger.run_id, "val/kl") == [(1, 2.0), (2, 4.0), (3, 6.0)]
        logger.finish()
    child = in_child.child
    assert child is not None and child.alive and child._process.pid != os.getpid()


def test_a_refused_write_comes_back_from_the_child_with_its_error_code(client):
    child = LogBatchProcess()
    try:
        with pytest.raises(MlflowException) as raised:
            child.log_batch(client.tracking_uri, uuid.uuid4().hex, [Metric("val/loss", 1.0, 0, 1)])
        assert raised.value.error_code == "RESOURCE_DOES_NOT_EXIST"
        assert not mlflow_retry.transient(raised.value)  # so it fails at once, as in-process
        run_id = _logger(client).run_id  # the child goes on after an error
        child.log_batch(client.tracking_uri, run_id, [Metric("val/loss", 0.5, 0, 1)])
        assert _history(client, run_id, "val/loss") == [(1, 0.5)]
    finally:
        child.close()
    assert not child.alive


def test_a_child_opens_its_store_before_the_first_batch_and_one_it_cannot_open_errs_per_batch(client):
    """The cohort's child is started with the tracking URI so it opens the store while the trial
    imports; a store it cannot open then fails each write with the store's own error, as an
    unopened one would, and the child stays up for the parent's retries."""
    run_id = _logger(client).run_id
    child = LogBatchProcess(client.tracking_uri)
    # Fails at once: a database server that is down is retried by MLflow for minutes.
    unopenable = "sqlite:////proc/no-such-folder/mlflow.db"
    unopened = LogBatchProcess(unopenable)
    try:
        child.log_batch(client.tracking_uri, run_id, [Metric("val/loss", 0.25, 0, 1)])
        assert _history(client, run_id, "val/loss") == [(1, 0.25)]
        for _ in range(2):
            with pytest.raises(FileNotFoundError, match="no-such-folder"):
                unopened.log_batch(unopenable, run_id, [Metric("val/loss", 9.0, 0, 2)])
            assert unopened.alive
        assert _history(client, run_id, "val/loss") == [(1, 0.25)]
    finally:
        child.close()
        unopened.close()


def test_a_killed_child_is_replaced_and_one_that_cannot_run_leaves_the_writes_here(client, in_child,
                                                                                   monkeypatch):
    _wait_for(lambda: in_child.child is not None)
    killed = in_child.child._process.pid
    os.kill(killed, signal.SIGKILL)
    _wait_for(lambda: not in_child.child.alive)
    logger = _logger(client)
    logger.log_metrics({"val/loss": 1.5}, step=1)  # waits: written before it returns
    assert _history(client, logger.run_id, "val/loss") == [(1, 1.5)]
    assert in_child.in_child and in_child.child._process.pid != killed  # a new child wrote it
    os.kill(in_child.child._process.pid, signal.SIGKILL)
    _wait_for(lambda: not in_child.child.alive)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the next child exits at once
    logger.log_metrics({"val/loss": 2.5}, step=2)  # fails in the child, retried here after a backoff
    logger.finish()  # ends the run once the queue is written
    assert _history(client, logger.run_id, "val/loss") == [(1, 1.5), (2, 2.5)]
    assert not in_child.in_child  # written in this process, and so from now on


def test_the_child_dies_with_a_killed_parent(tmp_path):
    """A trial killed with -9 takes its writer child with it: no write outlives the trial."""
    script = ("import time\n"
              "from workers import mlflow_retry\n"
              "mlflow_retry.write_in_child_process()\n"
              "while mlflow_retry._THREAD.child is None: time.sleep(0.05)\n"
              "print(mlflow_retry._THREAD.child._process.pid, flush=True)\n"
              "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    try:
        child_pid = int(parent.stdout.readline())
        os.kill(child_pid, 0)  # alive
        parent.kill()
        parent.wait(timeout=10)

        def gone() -> bool:
            try:
                os.kill(child_pid, 0)
            except ProcessLookupError:
                return True
            # A dead child not yet reaped by init is a zombie: gone too.
            with open(f"/proc/{child_pid}/stat") as stat:
                return stat.read().split(") ")[1].startswith("Z")

        _wait_for(gone, timeout_s=10)
    finally:
        parent.kill()

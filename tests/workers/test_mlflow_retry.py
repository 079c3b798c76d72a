"""MLflow writes through faults (workers/tracking/retry.py, writer.py): a real SQLite store behind a client
whose chosen calls fail the way a server outage makes them fail, before the write (refused)
or after it (the reply lost). The full outage, a real ``mlflow server`` stopped for 60 s
under a sweep, is tests/service/test_mlflow_outage.py."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR
from mlflow.tracking import MlflowClient

from workers.settings import MLFLOW_OUTAGE_ENV
from workers.tracking.runs import RunLogger, ensure_experiment


class FaultyClient:
    """A real client; ``log_batch`` of metrics fails ``refused`` times before writing, and once
    after writing for each step in ``lost`` (the server wrote it, the reply never came)."""

    def __init__(self, client: MlflowClient, refused: int = 0, lost: tuple[int, ...] = ()) -> None:
        self.client, self.refused, self.lost = client, refused, set(lost)
        self.metric_calls = 0

    def __getattr__(self, name):
        return getattr(self.client, name)

    def log_batch(self, run_id, metrics=(), **kwargs):
        if metrics:
            self.metric_calls += 1
            if self.refused:
                self.refused -= 1
                raise MlflowException("API request failed: connection refused", INTERNAL_ERROR)
        self.client.log_batch(run_id, metrics=metrics, **kwargs)
        if metrics and metrics[0].step in self.lost:
            self.lost.discard(metrics[0].step)
            raise MlflowException("API request failed: connection reset", INTERNAL_ERROR)


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db")


def _logger(client: MlflowClient, faulty: FaultyClient, buffered: bool) -> RunLogger:
    experiment_id = ensure_experiment(client, f"retry-{uuid.uuid4().hex[:8]}")
    run = client.create_run(experiment_id)
    return RunLogger(faulty, run.info.run_id, experiment_id, buffered=buffered)


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(point.step for point in client.get_metric_history(run_id, key))


@pytest.mark.parametrize("buffered", [False, True])
def test_a_batch_whose_reply_was_lost_is_not_written_twice(client, buffered):
    faulty = FaultyClient(client, lost=(2,))
    logger = _logger(client, faulty, buffered)
    for step in (1, 2, 3):
        logger.log_metrics({"val/loss": 1.0 / step, "val/latent_nmi": 0.1 * step}, step=step)
    logger.finish()
    assert _steps(client, logger.run_id, "val/loss") == [1, 2, 3]
    assert _steps(client, logger.run_id, "val/latent_nmi") == [1, 2, 3]
    assert faulty.metric_calls == 3  # the lost one was found written, not sent again
    assert client.get_run(logger.run_id).info.status == "FINISHED"


def test_epochs_are_buffered_while_writes_fail_and_written_in_order(client):
    faulty = FaultyClient(client, refused=3)
    logger = _logger(client, faulty, buffered=True)
    for step in range(1, 6):  # returns at once while the writer waits to retry
        logger.log_metrics({"val/loss": float(step)}, step=step)
    assert logger.buffered_batches >= 1
    logger.finish()
    history = client.get_metric_history(logger.run_id, "val/loss")
    assert [(p.step, p.value) for p in sorted(history, key=lambda p: p.step)] == [
        (step, float(step)) for step in range(1, 6)]
    assert faulty.metric_calls == 5 + 3
    assert client.get_run(logger.run_id).info.status == "FINISHED"


def test_a_refused_request_is_not_retried(client):
    faulty = FaultyClient(client)
    logger = RunLogger(faulty, uuid.uuid4().hex, "0")  # no such run
    with pytest.raises(MlflowException) as error:
        logger.log_metrics({"val/loss": 1.0}, step=1)
    assert error.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    assert faulty.metric_calls == 1


def test_an_outage_past_the_budget_fails_the_writes_and_still_ends_the_run(client, monkeypatch):
    monkeypatch.setenv(MLFLOW_OUTAGE_ENV, "2")
    faulty = FaultyClient(client, refused=10**6)
    logger = _logger(client, faulty, buffered=True)
    logger.log_metrics({"val/loss": 1.0}, step=1)
    with pytest.raises(RuntimeError, match="could not be written"):
        logger.finish("FAILED")
    assert client.get_metric_history(logger.run_id, "val/loss") == []
    assert client.get_run(logger.run_id).info.status == "FAILED"
    with pytest.raises(RuntimeError, match="could not be written"):
        logger.log_metrics({"val/loss": 2.0}, step=2)


class RecordingClient(FaultyClient):
    """A FaultyClient that records (thread name, run id, step) of every metric batch written."""

    def __init__(self, client: MlflowClient, **faults) -> None:
        super().__init__(client, **faults)
        self.written: list[tuple[str, str, int]] = []

    def log_batch(self, run_id, metrics=(), **kwargs):
        super().log_batch(run_id, metrics=metrics, **kwargs)
        if metrics:
            self.written.append((threading.current_thread().name, run_id, metrics[0].step))


def test_deferred_epochs_of_several_runs_are_written_in_order_by_one_thread(client):
    recording = RecordingClient(client)
    loggers = [_logger(client, recording, buffered=True) for _ in range(3)]
    for step in (1, 2, 3, 4):
        for logger in loggers:  # a cohort's members: one deferred batch per run per epoch
            logger.log_metrics({"val/loss": float(step), "val/kl": 2.0 * step}, step=step, wait=False)
    for logger in loggers:
        logger.settle()  # what a trainable calls before tune.report: written, writes succeeding
        assert _steps(client, logger.run_id, "val/loss") == [1, 2, 3, 4]
        assert _steps(client, logger.run_id, "val/kl") == [1, 2, 3, 4]
        assert [step for _, run_id, step in recording.written if run_id == logger.run_id] == [1, 2, 3, 4]
        assert logger.buffered_batches == 0  # queued while writes succeed: not counted as buffered
        logger.finish()
    assert {thread for thread, _, _ in recording.written} == {"mlflow-metrics"}
    assert len(recording.written) == recording.metric_calls == 12  # once each, none twice


def test_a_deferred_write_during_an_outage_lets_training_go_on_and_fails_at_the_end(client,
                                                                                   monkeypatch):
    monkeypatch.setenv(MLFLOW_OUTAGE_ENV, "3")
    faulty = FaultyClient(client, refused=10**6)
    logger = _logger(client, faulty, buffered=True)
    started = time.monotonic()
    logger.log_metrics({"val/loss": 1.0}, step=1, wait=False)
    assert time.monotonic() - started < 1.0  # queued, not written
    logger.settle()  # as a non-deferred epoch: no wait while the server fails
    assert time.monotonic() - started < 2.0 and logger.buffered_batches == 1
    with pytest.raises(RuntimeError, match="could not be written"):
        logger.flush()  # the run's end waits for them all: given up after the budget
    assert client.get_metric_history(logger.run_id, "val/loss") == []
    with pytest.raises(RuntimeError, match="could not be written"):
        logger.finish("FAILED")
    assert client.get_run(logger.run_id).info.status == "FAILED"

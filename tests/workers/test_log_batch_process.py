"""Metric batches written by a child process (workers/tracking/writer_process.py), as a cohort trial
writes them: a real SQLite store, a real child process, real kills."""

from __future__ import annotations

import dataclasses
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

from tests.support.mlflow_store import sqlite_store_uri
from workers.tracking import writer
from workers.tracking.retry import transient
from workers.tracking.runs import NewRun, RunLogger, ensure_experiment
from workers.tracking.writer import WriterProcess


@pytest.fixture
def client(tmp_path) -> MlflowClient:
    return MlflowClient(tracking_uri=sqlite_store_uri(tmp_path))


@pytest.fixture
def in_child():
    writer.write_in_child_process()
    yield writer._THREAD
    writer.write_in_child_process(False)


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
    child = WriterProcess()
    try:
        with pytest.raises(MlflowException) as raised:
            child.log_batch(client.tracking_uri, uuid.uuid4().hex, [Metric("val/loss", 1.0, 0, 1)])
        assert raised.value.error_code == "RESOURCE_DOES_NOT_EXIST"
        assert not transient(raised.value)  # so it fails at once, as in-process
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
    child = WriterProcess(client.tracking_uri)
    # Fails at once: a database server that is down is retried by MLflow for minutes.
    unopenable = "sqlite:////proc/no-such-folder/mlflow.db"
    unopened = WriterProcess(unopenable)
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
              "from workers.tracking import writer\n"
              "writer.write_in_child_process()\n"
              "while writer._THREAD.child is None: time.sleep(0.05)\n"
              "print(writer._THREAD.child._process.pid, flush=True)\n"
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


def _new_run(client: MlflowClient, name: str, cls: type[NewRun] = NewRun, **tags: str) -> NewRun:
    from mlflow.entities import Dataset, DatasetInput, InputTag

    experiment = f"made-{uuid.uuid4().hex[:8]}"
    parent = client.create_run(ensure_experiment(client, experiment)).info.run_id
    dataset = Dataset(name="tokens", digest="0123abcd", source_type="ksweep-dataset-store",
                      source='{"name": "tokens"}')
    return cls(client.tracking_uri, experiment, name, {"ksweep.trial_id": name, **tags},
               parent_run_id=parent, params={"alpha": 0.5, "model": {"hidden": 64}},
               inputs=(DatasetInput(dataset, [InputTag("mlflow.data.context", "training")]),))


def _made(client: MlflowClient, run_id: str) -> tuple:
    """What a made run holds, but its id and create token."""
    run = client.get_run(run_id)
    tags = {k: v for k, v in run.data.tags.items() if k != "ksweep.create_token"}
    inputs = [(d.dataset.name, d.dataset.digest, [(t.key, t.value) for t in d.tags])
              for d in run.inputs.dataset_inputs]
    return run.info.status, run.info.run_name, tags, run.data.params, inputs


def test_a_run_made_by_the_child_holds_what_one_made_here_holds(client):
    child = WriterProcess(client.tracking_uri)
    try:
        there, here = _new_run(client, "trial-0"), _new_run(client, "trial-0")
        run_id, experiment_id = child.create_run(there)
        assert experiment_id == client.get_experiment_by_name(there.experiment_name).experiment_id
        made_there, made_here = _made(client, run_id), _made(client, here.create()[0])
        assert made_there[2].pop("mlflow.parentRunId") == there.parent_run_id
        assert made_here[2].pop("mlflow.parentRunId") == here.parent_run_id
        assert made_there == made_here
        assert made_here[:2] == ("RUNNING", "trial-0")
        assert made_here[3] == {"alpha": "0.5", "model.hidden": "64"}
        assert made_here[4] == [("tokens", "0123abcd", [("mlflow.data.context", "training")])]
        # Made again with its token (its maker died before replying): the same run, nothing twice.
        assert there.create(adopt=True) == (run_id, experiment_id)
        again = _made(client, run_id)
        again[2].pop("mlflow.parentRunId")
        assert again == made_there
        assert len(client.search_runs([experiment_id], "tags.`ksweep.trial_id` = 'trial-0'")) == 1
    finally:
        child.close()


def test_runs_made_later_come_ahead_of_batches_and_a_refused_one_raises_its_error(client, in_child):
    futures = [writer.create_run_later(_new_run(client, f"member-{k}")) for k in range(3)]
    bad_key = dataclasses.replace(_new_run(client, "member-3"), params={"../alpha": 0.5})
    refused = writer.create_run_later(bad_key)
    for k, future in enumerate(futures):
        run_id, experiment_id = future.result(timeout=60)
        logger = RunLogger(client, run_id, experiment_id, buffered=True)
        logger.log_metrics({"val/loss": float(k)}, step=1, wait=False)
        logger.finish()
        assert client.get_run(run_id).info.run_name == f"member-{k}"
        assert _history(client, run_id, "val/loss") == [(1, float(k))]
    with pytest.raises(MlflowException) as raised:
        refused.result(timeout=60)
    assert raised.value.error_code == "INVALID_PARAMETER_VALUE"
    assert in_child.child is not None and in_child.child.alive  # made there, not here


class DiesAfterMaking(NewRun):
    """Its writer process makes the run, then dies before it can reply."""

    def create(self, adopt: bool = False) -> tuple[str, str]:
        made = super().create(adopt)
        if not adopt and os.getpid() != self.tags["maker"]:
            os._exit(1)
        return made


def test_a_run_whose_child_died_before_replying_is_made_once(client, in_child):
    new_run = _new_run(client, "member-0", DiesAfterMaking, maker=os.getpid())
    run_id, experiment_id = writer.create_run_later(new_run).result(timeout=60)
    runs = client.search_runs([experiment_id], "tags.`ksweep.trial_id` = 'member-0'")
    assert [r.info.run_id for r in runs] == [run_id]  # the child's run, adopted here
    assert runs[0].data.params == {"alpha": "0.5", "model.hidden": "64"}
    assert len(runs[0].inputs.dataset_inputs) == 1
    assert not in_child.in_child  # runs and batches are made in this process from now on


def test_a_cohort_writes_through_a_child_from_the_threshold_on(monkeypatch):
    from workers.settings import DEFAULT_MIN_RUNS, MIN_RUNS_ENV
    from workers.tracking.writer_process import worth_a_writer_process

    monkeypatch.delenv(MIN_RUNS_ENV, raising=False)
    assert DEFAULT_MIN_RUNS == 8
    assert not worth_a_writer_process(7) and worth_a_writer_process(8) and worth_a_writer_process(64)
    monkeypatch.setenv(MIN_RUNS_ENV, "2")
    assert not worth_a_writer_process(1) and worth_a_writer_process(2)
    monkeypatch.setenv(MIN_RUNS_ENV, "many")
    with pytest.raises(ValueError, match=f"{MIN_RUNS_ENV}='many': expected a whole number"):
        worth_a_writer_process(3)

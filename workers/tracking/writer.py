"""A trial's metric writer: one thread per process writes every run's batches in order, through
a writer process when the process writes many runs.

While writes succeed, :meth:`MetricWriter.submit` waits for its batch (at most
``KSWEEP_MLFLOW_SYNC_WAIT_S``), so MLflow holds every epoch the trial checkpoints; once a write
fails, epochs are queued and training goes on, and the run ends only after the queue is
written. A cohort of eight members or more (one batch per member per epoch;
:func:`workers.tracking.writer_process.worth_a_writer_process`) writes through a child
(:func:`write_in_child_process`, :class:`WriterProcess`) so MLflow's store work holds no GIL the
training thread needs; its member runs are made there too (:func:`create_run_later`).

Each batch is sent once per attempt and given up after a short timeout
(:func:`workers.tracking.wire.log_batch`). Every retry, and after a failed write the first attempt
of the next batch too, first asks whether the run has a new writer (a retried trial claimed it:
:meth:`MetricWriter.superseded`); if so this writer drops that batch and every later one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from mlflow.entities import Metric

from workers.contract import WRITER_TAG
from workers.settings import worker_settings
from workers.tracking import wire
from workers.tracking.retry import outage_budget_s, retrying, step_logged

__all__ = ["MetricWriter", "RunRequest", "WriterProcess", "create_run_later",
           "write_in_child_process"]

log = logging.getLogger("ksweep.tracking")



class RunRequest(Protocol):
    """A run to create (:class:`workers.tracking.runs.NewRun`): picklable, made by ``create``."""

    def create(self, adopt: bool = False) -> tuple[str, str]: ...


class WriterProcess:
    """The parent's handle on one writer process (``python -m workers.tracking.writer_process``);
    one request at a time. The child exits when its stdin closes, and on Linux the moment the
    thread that started it ends (``PR_SET_PDEATHSIG``): no write outlives a killed trial."""

    def __init__(self, tracking_uri: str | None = None) -> None:
        """Start the child; with ``tracking_uri``, it opens that store's client while it waits
        for the first batch (it builds one at the first request otherwise)."""
        # The parent's import path: the child imports the same mlflow (and this package).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "workers.tracking.writer_process", str(os.getpid()),
             *([tracking_uri] if tracking_uri else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def log_batch(self, tracking_uri: str, run_id: str, metrics: list) -> None:
        """``MlflowClient(tracking_uri).log_batch(run_id, metrics=metrics)`` in the child.

        Raises what the child's call raised; ``ChildProcessError`` if the child is gone (the
        writer's retry then checks the step and writes in-process)."""
        self._call("log_batch", (tracking_uri, run_id, metrics))

    def create_run(self, new_run: RunRequest) -> tuple[str, str]:
        """``new_run.create()`` in the child: (run id, experiment id). Raises as
        :meth:`log_batch` (after ``ChildProcessError`` the run may exist: its token finds it)."""
        result: tuple[str, str] = self._call("create_run", new_run)
        return result

    def _call(self, op: str, payload: Any) -> Any:
        with self._lock:
            try:
                pickle.dump((op, payload), self._process.stdin)
                self._process.stdin.flush()
                error, result = pickle.load(self._process.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as error:
                self.close()
                raise ChildProcessError(f"the MLflow writer process ended: {error!r}") from error
        if error is not None:
            raise error
        return result

    def close(self) -> None:
        """End the child (closing its stdin ends its loop)."""
        for stream in (self._process.stdin, self._process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()


class _WriterThread:
    """The one thread of a process that writes every :class:`MetricWriter`'s batches.

    One thread, not one per run: a cohort's K member runs would otherwise write to the store
    at once (a sqlite store serialises them behind its lock anyway). Each writer's batches
    are written in order; writers with batches take turns, one batch each. A failing write
    marks the server ``failing`` for every writer (it is the same server), a success clears it.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A fresh lock, queue and thread (also in a forked child: the parent's may be held)."""
        self.cond = threading.Condition()
        self.ready: deque[MetricWriter] = deque()  # writers with queued batches, each once
        self.failing = False  # the last attempt failed: submit does not wait
        self._thread: threading.Thread | None = None
        self.in_child = False  # write through a WriterProcess (write_in_child_process)
        self.child: WriterProcess | None = None  # none yet while in_child: the thread starts it
        self.child_uri: str | None = None  # the store the child opens while it waits
        self.new_runs: deque[tuple[RunRequest, Future]] = deque()  # create_run_later's, ahead of batches

    def wake(self, writer: MetricWriter | None = None) -> None:
        """Queue ``writer``'s turn (call holding ``cond``, after adding its batches); None: only
        make sure the thread runs (it then starts its child if one is wanted)."""
        if writer is not None and writer not in self.ready:
            self.ready.append(writer)
        if self._thread is None or not self._thread.is_alive():  # none yet, or lost in a fork
            self._thread = threading.Thread(target=self._run, name="mlflow-metrics", daemon=True)
            self._thread.start()
        self.cond.notify_all()

    def use_child(self, on: bool, tracking_uri: str | None = None) -> None:
        """From now on write through a child process, started at once by the thread (its
        imports overlap the caller's work; the thread starts it, so it dies with the thread);
        ``on`` False: write here again (after the queued batches) and end the child."""
        with self.cond:
            if on and not self.in_child:
                self.in_child, self.child_uri = True, tracking_uri
                self.wake()
            elif not on and self.in_child:
                while self.ready or self.new_runs:  # the thread uses the child until the queue is written
                    self.cond.wait(timeout=1.0)
                self.in_child, child, self.child = False, self.child, None
                if child is not None:
                    child.close()

    def log_batch(self, client, run_id: str, batch: list[Metric]) -> None:
        """Write one batch: in the child process when asked for and it starts, else here.

        A child that dies during the write raises ``ChildProcessError`` (transient): it may
        have written the batch first, so the retry checks the step before writing it here."""
        child = self._child() if self.in_child else None
        if child is None:
            wire.log_batch(client, run_id, batch)  # one attempt, given up after a short timeout
            return
        try:
            child.log_batch(client.tracking_uri, run_id, batch)
        except ChildProcessError as error:
            self._child_lost(error)
            raise

    def create_run(self, new_run: RunRequest) -> tuple[str, str]:
        """Create a run: in the child process when asked for and it starts, else here. A child
        that dies meanwhile may have made it: the run is then made here, adopting that one."""
        child = self._child() if self.in_child else None
        if child is None:
            return new_run.create()
        try:
            return child.create_run(new_run)
        except ChildProcessError as error:
            self._child_lost(error)
            return new_run.create(adopt=True)

    def _child_lost(self, error: ChildProcessError) -> None:
        """The child died mid-request: runs and batches are written in this process from now on."""
        log.warning("writing MLflow runs and metrics in this process from now on: %s", error)
        self.in_child, self.child = False, None

    def _child(self) -> WriterProcess | None:
        """The running child, started if need be (on this thread); None if it cannot start."""
        if self.child is None or not self.child.alive:
            try:
                self.child = WriterProcess(self.child_uri)
            except OSError as error:
                log.warning("MLflow metrics are written in this process: no writer process (%s)", error)
                self.in_child, self.child = False, None
        return self.child

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.ready and not self.new_runs and not (self.in_child and self.child is None):
                    self.cond.wait()
                new_run = self.new_runs[0] if self.new_runs else None  # left queued until made
                starting = new_run is None and not self.ready
                if new_run is None and not starting:
                    writer = self.ready[0]
                    batch = writer._pending[0][0]
            if new_run is not None:
                request, future = new_run
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(self.create_run(request))
                    except BaseException as error:  # noqa: BLE001 (raised by the future's result())
                        future.set_exception(error)
                with self.cond:
                    self.new_runs.popleft()
                    self.cond.notify_all()
                continue
            if starting:
                self._child()
                continue
            try:
                writer._write(batch)
            except Exception as error:  # noqa: BLE001 (recorded, raised by its next submit or flush)
                with self.cond:
                    writer._error = error
                    writer._pending.clear()
                    self.failing = False  # given up: the next write finds the server afresh
                    self.ready.popleft()
                    self.cond.notify_all()
                continue
            with self.cond:
                writer._pending.popleft()
                self.failing = False
                self.ready.popleft()
                if writer._pending:
                    self.ready.append(writer)
                self.cond.notify_all()


_THREAD = _WriterThread()
os.register_at_fork(after_in_child=_THREAD.reset)


def write_in_child_process(on: bool = True, tracking_uri: str | None = None) -> None:
    """Write this process's metric batches from a child process from now on
    (:mod:`workers.tracking.writer_process`: a cohort's many runs then cost its training thread no
    GIL); started at once, opening ``tracking_uri``'s store while it waits when given. If the
    child cannot start or dies, writes go on in this process. ``on=False``: back to this
    process (once the queued batches are written)."""
    _THREAD.use_child(on, tracking_uri)


def create_run_later(new_run: RunRequest) -> Future[tuple[str, str]]:
    """Have the writer thread create ``new_run`` (:class:`workers.tracking.runs.NewRun`), in the
    writer process when there is one (:func:`write_in_child_process`), ahead of any queued metric
    batch; the future's result is (run id, experiment id), or what the creation raised. The
    caller goes on meanwhile: a cohort's first epoch trains while its members' runs are made."""
    future: Future[tuple[str, str]] = Future()
    with _THREAD.cond:
        _THREAD.new_runs.append((new_run, future))
        _THREAD.wake()
    return future


class MetricWriter:
    """Queues a run's metric batches for the process's writer thread (see the module doc)."""

    def __init__(self, client, run_id: str, sync_wait_s: float | None = None,
                 owner: str | None = None) -> None:
        self._client, self._run_id, self.owner = client, run_id, owner
        self._sync_wait_s = worker_settings().mlflow_sync_wait_s if sync_wait_s is None else sync_wait_s
        self._pending: deque[tuple[list[Metric], float]] = deque()
        self._error: BaseException | None = None  # a batch that could not be written at all
        self.buffered_batches = 0  # batches queued while the server was failing (a read-out)
        self._unsettled = 0  # batches submitted since the last settle
        self._unsure = False  # the last write failed: the run may have a new writer since
        self._dropping = False  # it has: every later batch is the new writer's to log

    def submit(self, batches: Sequence[list[Metric]], wait: bool = True) -> None:
        """Queue batches; ``wait``: then :meth:`settle`. False: return at once, and the caller
        calls :meth:`settle` before it checkpoints the epoch (module doc)."""
        with self._cond:
            self._raise_if_failed()
            now = time.monotonic()
            self._pending.extend((list(batch), now) for batch in batches)
            self._unsettled += len(batches)
            if self._pending:
                _THREAD.wake(self)
        if wait:
            self.settle()

    def settle(self) -> None:
        """Wait for the queued batches while writes succeed, at most ``KSWEEP_MLFLOW_SYNC_WAIT_S``
        from when the oldest was queued; at once while the server is failing (they stay queued
        and training goes on: module doc). Raises the writer's error if a batch was given up."""
        with self._cond:
            # Waited for from when the oldest queued batch was queued: a write stuck in the
            # client's own retries holds training up once, not at every epoch.
            deadline = self._pending[0][1] + self._sync_wait_s if self._pending else 0.0
            while self._pending and not _THREAD.failing and time.monotonic() < deadline:
                self._cond.wait(timeout=deadline - time.monotonic())
            self._raise_if_failed()
            if self._pending:  # the batches queued since the last settle went on unwritten
                self.buffered_batches += min(self._unsettled, len(self._pending))
            self._unsettled = 0

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued batch is written (raises the writer's error if one could
        not be written within the outage budget)."""
        deadline = time.monotonic() + (outage_budget_s() + 60 if timeout_s is None else timeout_s)
        with self._cond:
            while self._pending and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self._pending)} metric batch(es) of run "
                                       f"{self._run_id} still unwritten")
                self._cond.wait(timeout=min(left, 5.0))
            self._raise_if_failed()

    @property
    def _cond(self) -> threading.Condition:
        return _THREAD.cond  # read each time: a forked child has a new one

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"MLflow metrics of run {self._run_id} could not be written: "
                               f"{self._error}") from self._error

    def _write(self, batch: list[Metric]) -> None:
        """Write one batch, retried while the server fails. Each retry, and after a failed write
        the first attempt of the next batch too, first asks whether the run has a new writer
        (then this batch and every later one are dropped) or holds the step already."""
        if self._dropping:
            return
        first = batch[0]

        def call() -> None:
            try:
                _THREAD.log_batch(self._client, self._run_id, batch)
            except BaseException:
                self._unsure = True
                with self._cond:
                    _THREAD.failing = True
                    self._cond.notify_all()
                raise
            self._unsure = False

        retrying(call, f"log_batch of step {first.step} to run {self._run_id}",
                 done=lambda: self.superseded() or step_logged(self._client, self._run_id,
                                                               first.key, first.step),
                 check_first=self._unsure)

    def superseded(self) -> bool:
        """Whether another process claimed the run (``WRITER_TAG``): a retried write of this
        one is then dropped, the epoch being the new writer's to log."""
        if self.owner is None:
            return False
        writer = self._client.get_run(self._run_id).data.tags.get(WRITER_TAG)
        if writer is None or writer == self.owner:
            return False
        if not self._dropping:
            log.warning("run %s was taken over by writer %s: the writes of writer %s are dropped",
                        self._run_id, writer, self.owner)
        self._dropping = True
        return True

"""Riding out an MLflow tracking server that is down: retries with backoff, and a metric
writer that buffers a trial's epochs while the server is away.

MLflow's REST client retries a failed request itself (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
7, with ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` 2: about four minutes) and then raises an
``MlflowException``. Every write of :class:`workers.tracking.runs.RunLogger` is retried on top of
that (:func:`retrying`, tenacity, exponential backoff with jitter, 1 s doubling up to 15 s)
for up to ``KSWEEP_MLFLOW_OUTAGE_S`` seconds (900), so an outage longer than the client's own
retries is survived too; errors that no retry can mend (a bad parameter, a missing run) are raised
at once.

A trial's per-epoch metrics go through a :class:`MetricWriter`: one background thread per
process writes every run's batches, each run's in order. While writes succeed,
:meth:`MetricWriter.submit` waits for its batch (at most ``KSWEEP_MLFLOW_SYNC_WAIT_S``, 10 s),
so MLflow holds every epoch before the trial reports (and checkpoints) it, as without a
buffer; once a write fails, epochs are queued and training goes on, and the run is only ended
after the queue is written. ``submit(wait=False)`` returns at once (a sweep's trials: the
write overlaps the rest of the epoch end and the checkpoint); its caller then calls
:meth:`MetricWriter.settle`, the same wait, before Tune records the epoch's checkpoint, so
what a checkpoint may hold that MLflow lacks is what it was before: only epochs queued while
the server fails (a resumed trial backfills those from its checkpoint: workers/trial.py).
Values are plain floats by the time they are queued (no tensor is kept, no host sync is added).

A process that writes many runs' batches (a cohort trial: one per member per epoch) calls
:func:`write_in_child_process`: the thread then hands each batch to a child process
(:mod:`workers.tracking.writer_process`) and waits on a pipe, so MLflow's store work (mostly Python,
about 25 ms per batch on a sqlite store) runs on another core instead of holding the GIL the
training thread needs. Errors come back as raised, so the retries below are unchanged. Its
member runs are created there too (:func:`create_run_later`), while its first epoch trains.

A batch that was written while its reply was lost must not be written again (the same step
twice is two points): after a failed attempt, the writer first reads the metric's history
and skips the batch when the step is there.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

from mlflow.entities import Metric
from mlflow.exceptions import MlflowException

from workers.backoff import retry_call
from workers.tracking.writer_process import LogBatchProcess

if TYPE_CHECKING:
    from workers.tracking.runs import NewRun

__all__ = ["MetricWriter", "MLFLOW_OUTAGE_ENV", "SYNC_WAIT_ENV", "create_run_later", "outage_budget_s",
           "retrying", "transient", "write_in_child_process"]

log = logging.getLogger("ksweep.tracking")

MLFLOW_OUTAGE_ENV = "KSWEEP_MLFLOW_OUTAGE_S"
SYNC_WAIT_ENV = "KSWEEP_MLFLOW_SYNC_WAIT_S"
T = TypeVar("T")

# Error codes of a server that is down, overloaded or failing: a retry may succeed. A request
# it refused (INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST, ...) fails at once. The client
# reports a refused connection, once its own retries are spent, as INTERNAL_ERROR.
_TRANSIENT = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "IO_ERROR", "SERVICE_UNDER_MAINTENANCE",
              "WORKSPACE_TEMPORARILY_UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED",
              "ABORTED", "REQUEST_LIMIT_EXCEEDED", "UNPARSEABLE_HTTP_ERROR",
              "COULD_NOT_ACQUIRE_LOCK"}


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {os.environ[name]!r}") from None


def outage_budget_s() -> float:
    """How long writes are retried before they fail (``KSWEEP_MLFLOW_OUTAGE_S``, 900 s)."""
    return _env_float(MLFLOW_OUTAGE_ENV, 900.0)


def transient(error: BaseException) -> bool:
    """Whether a retry may succeed: the server unreachable, timing out or failing (5xx), not
    a request it refused."""
    if isinstance(error, MlflowException):
        return error.error_code in _TRANSIENT
    return isinstance(error, OSError | ConnectionError | TimeoutError)


def retrying(call: Callable[[], T], what: str, *, done: Callable[[], bool] | None = None,
             budget_s: float | None = None) -> T | None:
    """``call()``, retried with backoff while it fails transiently (:func:`transient`), for
    ``budget_s`` seconds (default :func:`outage_budget_s`); then the last error is raised.

    ``done``: for writes that must not happen twice (see :func:`workers.backoff.retry_call`).
    """
    return retry_call(call, f"MLflow {what}", budget_s=outage_budget_s() if budget_s is None
                      else budget_s, retry_if=transient, log=log, done=done, max_wait_s=15.0)


def step_logged(client, run_id: str, key: str, step: int) -> bool:
    """Whether ``key`` already has a point at ``step`` in the run."""
    return any(point.step == step for point in client.get_metric_history(run_id, key))


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
        self.in_child = False  # write through a LogBatchProcess (write_in_child_process)
        self.child: LogBatchProcess | None = None  # none yet while in_child: the thread starts it
        self.child_uri: str | None = None  # the store the child opens while it waits
        self.new_runs: deque[tuple[NewRun, Future]] = deque()  # create_run_later's, ahead of batches

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
            client.log_batch(run_id, metrics=batch, synchronous=True)
            return
        try:
            child.log_batch(client.tracking_uri, run_id, batch)
        except ChildProcessError as error:
            self._child_lost(error)
            raise

    def create_run(self, new_run: NewRun) -> tuple[str, str]:
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

    def _child(self) -> LogBatchProcess | None:
        """The running child, started if need be (on this thread); None if it cannot start."""
        if self.child is None or not self.child.alive:
            try:
                self.child = LogBatchProcess(self.child_uri)
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


def create_run_later(new_run: NewRun) -> Future[tuple[str, str]]:
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

    def __init__(self, client, run_id: str, sync_wait_s: float | None = None) -> None:
        self._client, self._run_id = client, run_id
        self._sync_wait_s = _env_float(SYNC_WAIT_ENV, 10.0) if sync_wait_s is None else sync_wait_s
        self._pending: deque[tuple[list[Metric], float]] = deque()
        self._error: BaseException | None = None  # a batch that could not be written at all
        self.buffered_batches = 0  # batches queued while the server was failing (a read-out)
        self._unsettled = 0  # batches submitted since the last settle

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
        first = batch[0]

        def call() -> None:
            try:
                _THREAD.log_batch(self._client, self._run_id, batch)
            except BaseException:
                with self._cond:
                    _THREAD.failing = True
                    self._cond.notify_all()
                raise

        retrying(call, f"log_batch of step {first.step} to run {self._run_id}",
                 done=lambda: step_logged(self._client, self._run_id, first.key, first.step))

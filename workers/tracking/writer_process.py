"""MLflow's ``log_batch`` in a child process, for the metric writer thread (workers/tracking/writer.py).

MLflow's SQLAlchemy store spends about 25 ms of Python per batch of ~160 metrics (ORM objects,
the latest-metrics update). A cohort writes one batch per member per epoch, and on the writer
thread that work holds the GIL the training thread needs. In a child process it runs on
another core; the writer thread only waits on a pipe, with the GIL released.

The writer thread starts the child (``python -m workers.tracking.writer_process``) and sends it
pickled requests on its stdin: ``("log_batch", (tracking_uri, run_id, metrics))``, or
``("create_run", new_run)`` (a :class:`workers.tracking.runs.NewRun`: a cohort's member runs are
made here while its first epoch trains). For each request the child replies on its stdout,
pickled: ``(None, result)``, or ``(error, None)`` with the exception the call raised. So the
thread's retries (:func:`workers.tracking.writer.retrying`) see the same errors as an in-process
call.
What the child prints goes to stderr. The child exits when its stdin closes (the parent ended).
On Linux it is also killed the moment the thread that started it ends
(``PR_SET_PDEATHSIG``; that thread lives as long as the process). So no write outlives a
killed trial, as none on the thread would.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.tracking.runs import NewRun

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class LogBatchProcess:
    """The parent's handle on one child; :meth:`log_batch` from one thread at a time."""

    def __init__(self, tracking_uri: str | None = None) -> None:
        """Start the child; with ``tracking_uri``, it opens that store's client while it waits
        for the first batch (it builds one at the first request otherwise)."""
        # The parent's import path: the child imports the same mlflow (and this module).
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

    def create_run(self, new_run: NewRun) -> tuple[str, str]:
        """``new_run.create()`` in the child: (run id, experiment id). Raises as
        :meth:`log_batch` (after ``ChildProcessError`` the run may exist: its token finds it)."""
        return self._call("create_run", new_run)

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


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):  # else the closed stdin still ends it
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(0)


def _picklable(error: BaseException) -> BaseException:
    """What the parent can unpickle: the error itself, or an MlflowException that keeps its code."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 (an exception type that does not pickle)
        from mlflow.exceptions import MlflowException
        from mlflow.protos import databricks_pb2

        code = getattr(error, "error_code", "INTERNAL_ERROR")
        return MlflowException(f"{type(error).__name__}: {error}",
                               error_code=databricks_pb2.ErrorCode.Value(code)
                               if isinstance(code, str) else code)


def main(parent: int, tracking_uri: str | None = None) -> None:
    """The child's loop: one request, one reply, until the parent closes stdin."""
    _die_with_parent(parent)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the replies
    requests = sys.stdin.buffer
    from mlflow import MlflowClient

    clients: dict[str, MlflowClient] = {}
    if tracking_uri:
        # A store that cannot be opened now is opened again at the first request, whose
        # error then goes back to the parent's retries.
        with contextlib.suppress(Exception):
            clients[tracking_uri] = MlflowClient(tracking_uri)
    import workers.tracking.runs  # noqa: F401 (what a create_run request unpickles; ahead of it)

    while True:
        try:
            op, payload = pickle.load(requests)
        except EOFError:
            return
        reply: tuple[BaseException | None, Any] = (None, None)
        try:
            if op == "create_run":
                reply = (None, payload.create())
            else:
                tracking_uri, run_id, metrics = payload
                client = clients.get(tracking_uri) or clients.setdefault(tracking_uri, MlflowClient(tracking_uri))
                client.log_batch(run_id, metrics=metrics, synchronous=True)
        except Exception as failure:  # noqa: BLE001 (sent back: the parent's retries decide)
            reply = (_picklable(failure), None)
        pickle.dump(reply, replies)
        replies.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]), *sys.argv[2:3])

"""The writer process: ``python -m workers.tracking.writer_process PARENT_PID [TRACKING_URI]``.

MLflow's SQLAlchemy store does its work in Python; in this child it runs on another core while
the parent's writer thread (:class:`workers.tracking.writer.WriterProcess`) waits on a pipe with
the GIL released. Requests come pickled on stdin, ``("log_batch", (uri, run_id, metrics))`` or
``("create_run", new_run)``; each gets one pickled reply, ``(None, result)`` or ``(error,
None)``, so the parent's retries see what an in-process call would (a batch is written by
:func:`workers.tracking.wire.log_batch`, as in the parent). What the child prints goes
to stderr. It exits when stdin closes, and on Linux when its parent thread ends.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1  # linux/prctl.h



def writer_process_min_runs() -> int:
    """``KSWEEP_WRITER_PROCESS_MIN_RUNS`` (default 8), checked: a ValueError naming it else."""
    from workers.settings import worker_settings  # the parent asks; the child never does

    return worker_settings().writer_process_min_runs


def worth_a_writer_process(runs: int) -> bool:
    """Whether a process that writes ``runs`` runs' metrics at once (a cohort's members) writes
    them through a writer process: at ``KSWEEP_WRITER_PROCESS_MIN_RUNS`` runs or more."""
    return runs >= writer_process_min_runs()


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

    from workers.tracking import wire

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
                wire.log_batch(client, run_id, metrics)  # one attempt, as in the parent
        except Exception as failure:  # noqa: BLE001 (sent back: the parent's retries decide)
            reply = (_picklable(failure), None)
        pickle.dump(reply, replies)
        replies.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]), *sys.argv[2:3])

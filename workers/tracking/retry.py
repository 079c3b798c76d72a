"""MLflow calls retried while the tracking server is down, and the check a retried write makes.

MLflow's REST client retries a failed request itself (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, 7,
backoff factor 2: about four minutes) and then raises; a trial's metric batch is sent once
instead (:func:`workers.tracking.wire.log_batch`). :func:`retrying` retries on top of that
(:func:`workers.backoff.retry_call`: 1 s doubling up to 15 s, with jitter) for up to
``KSWEEP_MLFLOW_OUTAGE_S`` seconds, so a longer outage is survived too; an error no retry can
mend (a bad parameter, a missing run) is raised at once. A batch written while its reply was
lost is not written again: the retry first asks :func:`step_logged` (and a metric writer whose
run has a new writer drops it: :meth:`workers.tracking.writer.MetricWriter.superseded`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from mlflow.exceptions import MlflowException

from workers.backoff import retry_call
from workers.settings import worker_settings

__all__ = ["outage_budget_s", "retrying", "step_logged", "transient"]

log = logging.getLogger("ksweep.tracking")

T = TypeVar("T")

# Error codes of a server that is down, overloaded or failing: a retry may succeed. A request
# it refused (INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST, ...) fails at once. The client
# reports a refused connection, once its own retries are spent, as INTERNAL_ERROR.
_TRANSIENT = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "IO_ERROR", "SERVICE_UNDER_MAINTENANCE",
              "WORKSPACE_TEMPORARILY_UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED",
              "ABORTED", "REQUEST_LIMIT_EXCEEDED", "UNPARSEABLE_HTTP_ERROR",
              "COULD_NOT_ACQUIRE_LOCK"}


def outage_budget_s() -> float:
    """How long writes are retried before they fail (``KSWEEP_MLFLOW_OUTAGE_S``, 900 s)."""
    return worker_settings().mlflow_outage_s


def transient(error: BaseException) -> bool:
    """Whether a retry may succeed: the server unreachable, timing out or failing (5xx), not
    a request it refused."""
    if isinstance(error, MlflowException):
        return error.error_code in _TRANSIENT
    return isinstance(error, OSError | ConnectionError | TimeoutError)


def retrying(call: Callable[[], T], what: str, *, done: Callable[[], bool] | None = None,
             budget_s: float | None = None, check_first: bool = False) -> T | None:
    """``call()``, retried with backoff while it fails transiently (:func:`transient`), for
    ``budget_s`` seconds (default :func:`outage_budget_s`); then the last error is raised.

    ``done``, ``check_first``: for writes that must not happen twice (see
    :func:`workers.backoff.retry_call`).
    """
    return retry_call(call, f"MLflow {what}", budget_s=outage_budget_s() if budget_s is None
                      else budget_s, retry_if=transient, log=log, done=done, max_wait_s=15.0,
                      check_first=check_first)


def step_logged(client, run_id: str, key: str, step: int) -> bool:
    """Whether ``key`` already has a point at ``step`` in the run."""
    return any(point.step == step for point in client.get_metric_history(run_id, key))

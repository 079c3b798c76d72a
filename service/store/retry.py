"""Store calls that wait out a database restart: retried with backoff while the server is
unreachable (a refused or dropped connection), for up to ``KSWEEP_STORE_OUTAGE_S`` (600 s).

Only what cannot be lost goes through here: a driver's start and its final status. Progress
reports while a sweep runs are not retried (the next one, a second later, carries the same
counters and more).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from service.settings import Settings
from workers.backoff import retry_call
from workers.settings import read_settings

__all__ = ["store_retrying", "unreachable"]

log = logging.getLogger("ksweep.store")
T = TypeVar("T")


def unreachable(error: BaseException) -> bool:
    """The database did not answer: refused, dropped or shutting down (not a bad query)."""
    if isinstance(error, OperationalError | InterfaceError):
        return True
    return isinstance(error, DBAPIError) and error.connection_invalidated


def store_retrying(call: Callable[[], T], what: str, budget_s: float | None = None) -> T:
    """``call()``, retried while the store is unreachable; the last error once the budget is spent."""
    if budget_s is None:
        budget_s = read_settings(Settings).store_outage_s  # as the environment has it now
    return retry_call(call, f"store: {what}", budget_s=budget_s, retry_if=unreachable, log=log,
                      initial_s=0.5, max_wait_s=15.0)  # type: ignore[return-value]

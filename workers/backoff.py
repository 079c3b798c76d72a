"""Calls retried with exponential backoff while their dependency is away (tenacity): the one
retry policy of MLflow writes (``workers/tracking/retry.py``) and store writes
(``service/store/retry.py``). Plain Python, no MLflow, torch or Ray."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

__all__ = ["retry_call"]

T = TypeVar("T")


def _before_sleep(log: logging.Logger, what: str) -> Callable[[RetryCallState], None]:
    def report(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        first = str(error).splitlines()[0][:300] if error else ""
        log.warning("%s failed (attempt %d, retrying in %.1f s): %s", what,
                    state.attempt_number, state.upcoming_sleep, first)
    return report


def retry_call(call: Callable[[], T], what: str, *, budget_s: float,
               retry_if: Callable[[BaseException], bool], log: logging.Logger,
               done: Callable[[], bool] | None = None, initial_s: float = 1.0,
               max_wait_s: float = 30.0, check_first: bool = False) -> T | None:
    """``call()``, retried while it raises what ``retry_if`` accepts, waiting ``initial_s``,
    doubling up to ``max_wait_s`` (with jitter), until ``budget_s`` seconds have passed; then
    the last error is raised. Anything else is raised at once.

    ``done``: for writes that must not happen twice, asked before every attempt but the first
    (``check_first``: the first too); True (the failed attempt was written after all, or the
    write is no longer wanted) returns None without calling again.
    """
    for attempt in Retrying(
        stop=stop_after_delay(budget_s),
        wait=wait_exponential_jitter(multiplier=initial_s, max=max_wait_s, jitter=initial_s),
        retry=retry_if_exception(retry_if), before_sleep=_before_sleep(log, what), reraise=True,
    ):
        with attempt:
            if ((check_first or attempt.retry_state.attempt_number > 1) and done is not None
                    and done()):
                return None
            return call()
    return None  # not reached: tenacity returns from inside the block or raises

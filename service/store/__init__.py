"""The service's SQL store of sweeps and trials: tables (:mod:`.db`), Alembic migrations
(``migrations/``) and the queries the API, the supervisor and the drivers run (:mod:`.queries`).

Its names load on first use (SQLAlchemy is about a third of the API's import): the API's
modules import :mod:`.columns` without the tables.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.store.db import SweepRow, TrialRow, migrate
    from service.store.queries import IdempotencyConflict, Store

__all__ = ["IdempotencyConflict", "Store", "SweepRow", "TrialRow", "migrate"]
_HOMES = {"IdempotencyConflict": "queries", "Store": "queries", "SweepRow": "db", "TrialRow": "db",
          "migrate": "db"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'service.store' has no attribute {name!r}")
    return getattr(importlib.import_module(f"service.store.{_HOMES[name]}"), name)

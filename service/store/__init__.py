"""The service's SQL store of sweeps and trials: tables (:mod:`.db`), Alembic migrations
(``migrations/``) and the queries the API, the supervisor and the drivers run (:mod:`.queries`)."""

from service.store.db import SweepRow, TrialRow, migrate
from service.store.queries import IdempotencyConflict, Store

__all__ = ["IdempotencyConflict", "Store", "SweepRow", "TrialRow", "migrate"]

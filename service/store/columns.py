"""The columns of a sweep's document (GET /sweeps/{id}, GET /sweeps), in this order: the store's
hot-read queries select them and the API's documents read them back by position. Kept apart
from :mod:`.queries` so that the API names them without loading SQLAlchemy at import."""

from __future__ import annotations

from sweeps.status import COUNTERS

# Each column fetched costs ~0.1 us per row in the sqlite3 module, most of a page's SQL time;
# the store runs them through its `_DriverQuery`.
DOCUMENT_COLUMNS = (
    "id", "name", "owner", "state", *COUNTERS,
    "best_metric", "best_value", "best_trial", "best_config", "eta_seconds", "created_at",
    "started_at", "finished_at", "updated_at", "error", "experiment_id", "parent_run_id",
    "launcher", "driver_handle", "attempts",
)

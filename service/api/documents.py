"""A stored sweep as the API shows it (:class:`~service.api.schemas.Sweep`), built from its row.

One builder, two ways out: :func:`sweep_resource`, the :class:`Sweep` model (submission,
cancel); :func:`sweep_json` and :func:`page_json`, the same JSON bytes for the hot reads,
written by pydantic-core without building models (``tests/service/test_documents.py``
compares the bytes). Non-finite floats are written ``null``, as the model writes them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter
from pydantic_core import to_json

from service.api.schemas import Sweep, utc_time
from service.lifecycle import ACTIVE_SWEEP_STATES
from service.store.columns import DOCUMENT_COLUMNS
from sweeps.status import COUNTERS
from workers.contract import mlflow_ui_url

if TYPE_CHECKING:  # the store's tables load with the store (the app's lifespan), not at import
    from sqlalchemy import Row

    from service.store.db import SweepRow

_DATETIME = TypeAdapter(datetime)
# The counters' keys, in the API's order (a dict display: zip() cost 0.5 us a sweep).
_TOTAL, _PENDING, _RUNNING, _DONE, _FAILED, _STOPPED = COUNTERS
TimeText = Callable[[Any], Any]

# A best config is one of a sweep's few trial configs, so a page holds few distinct texts: they
# are decoded once (1.6 us each). The dicts are shared, and only ever serialised.
_json_config = functools.lru_cache(maxsize=4096)(json.loads)


def json_time(value: datetime | str | None) -> str | None:
    """A stored time as pydantic writes a UTC datetime: ``2026-12-03T16:31:20.170000Z``,
    without the fraction when it is zero. SQLite's text as SQLAlchemy writes it (naive UTC,
    ``2026-12-03 16:31:20.170000``) is rewritten by slicing, four times a sweep; anything else
    (a Postgres datetime, another text) goes through pydantic itself."""
    if value is None:
        return None
    if type(value) is str and len(value) == 26 and value[10] == " " and value[19] == ".":
        if value[20:] == "000000":
            return value[:10] + "T" + value[11:19] + "Z"
        return value.replace(" ", "T") + "Z"
    return _DATETIME.dump_python(_DATETIME.validate_python(utc_time(value)), mode="json")


def _document(values: Sequence[Any], ui_base: str, time: TimeText) -> dict[str, Any]:
    """The plain data of a :class:`Sweep` from the values of :data:`DOCUMENT_COLUMNS` (unpacked
    by position: a page builds 50 of these), its keys in the model's order; ``time`` writes
    each timestamp."""
    (sweep_id, name, owner, state, total, pending, running, done, failed, stopped,
     best_metric, best_value, best_trial, best_config, eta_seconds, created_at, started_at,
     finished_at, updated_at, error, experiment_id, parent_run_id, launcher, driver_handle,
     attempts) = values
    if type(best_config) is str:  # SQLite's JSON text
        best_config = _json_config(best_config)
    ui_url = None
    if experiment_id:
        ui_url = mlflow_ui_url(ui_base, experiment_id, parent_run_id)
    finished = done + failed + stopped
    prefix = f"/api/v1/sweeps/{sweep_id}"
    return {
        "id": sweep_id, "name": name, "owner": owner, "state": state,
        "counters": {_TOTAL: total, _PENDING: pending, _RUNNING: running, _DONE: done,
                     _FAILED: failed, _STOPPED: stopped},
        "progress": min(1.0, finished / total) if total else 0.0,
        "best": {"metric": best_metric, "value": best_value, "trial_id": best_trial,
                 "config": best_config},
        "eta_seconds": eta_seconds if state in ACTIVE_SWEEP_STATES else 0.0,
        "created_at": time(created_at), "started_at": time(started_at),
        "finished_at": time(finished_at), "updated_at": time(updated_at), "error": error,
        "mlflow": {"experiment_id": experiment_id, "parent_run_id": parent_run_id,
                   "ui_url": ui_url},
        "driver": {"launcher": launcher, "handle": driver_handle, "attempts": attempts},
        "links": {"self": prefix, "trials": f"{prefix}/trials", "report": f"{prefix}/report",
                  "cancel": f"{prefix}/cancel"},
    }


def sweep_resource(row: SweepRow | Row, ui_base: str) -> Sweep:
    """The :class:`Sweep` of a stored sweep (an ORM row or a Core row of its summary columns),
    validated in one call, not one per nested model."""
    values = tuple(getattr(row, name) for name in DOCUMENT_COLUMNS)
    return Sweep.model_validate(_document(values, ui_base, utc_time))


def sweep_json(values: Sequence[Any], ui_base: str) -> bytes:
    """The JSON of a sweep (the bytes :func:`sweep_resource`'s model serialises to) from the
    values of :data:`DOCUMENT_COLUMNS`, without building the model."""
    return to_json(_document(values, ui_base, json_time), inf_nan_mode="null")


def page_json(rows: Sequence[Sequence[Any]], total: int, limit: int, offset: int,
              ui_base: str) -> bytes:
    """The JSON of a :class:`~service.api.schemas.SweepPage` of ``rows`` (the same bytes)."""
    items = [_document(values, ui_base, json_time) for values in rows]
    return to_json({"items": items, "total": total, "limit": limit, "offset": offset},
                   inf_nan_mode="null")

"""The hot reads' JSON (service.api.documents) against the pydantic-serialised documents, byte for
byte, on a seeded store: SQLite, and Postgres (slow: a throwaway server) where it is installed."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import TypeAdapter
from sqlalchemy import insert

from service.api import documents
from service.api.schemas import Sweep, SweepPage, utc_time
from service.store.db import SweepRow
from service.store.queries import Store
from tests.support.outage_servers import Postgres, postgres_bin
from workers.contract import mlflow_ui_url

UI = "http://mlflow.example:5000/"
STATES = ("queued", "running", "succeeded", "failed", "cancelled")


def reference(row: SweepRow) -> Sweep:
    """The documented view of a stored sweep, field by field from the ORM row (the spelling of
    the API before the hot reads built their JSON themselves)."""
    def utc(value: datetime | None) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    finished = row.done + row.failed + row.stopped
    prefix = f"/api/v1/sweeps/{row.id}"
    return Sweep(
        id=row.id, name=row.name, owner=row.owner, state=row.state,  # type: ignore[arg-type]
        counters={"total": row.total, "pending": row.pending, "running": row.running,
                  "done": row.done, "failed": row.failed, "stopped": row.stopped},
        progress=min(1.0, finished / row.total) if row.total else 0.0,
        best={"metric": row.best_metric, "value": row.best_value, "trial_id": row.best_trial,
              "config": row.best_config},
        eta_seconds=row.eta_seconds if row.state in ("queued", "running") else 0.0,
        created_at=utc(row.created_at), started_at=utc(row.started_at),
        finished_at=utc(row.finished_at), updated_at=utc(row.updated_at), error=row.error,
        mlflow={"experiment_id": row.experiment_id, "parent_run_id": row.parent_run_id,
                "ui_url": mlflow_ui_url(UI, row.experiment_id, row.parent_run_id)
                if row.experiment_id else None},
        driver={"launcher": row.launcher, "handle": row.driver_handle, "attempts": row.attempts},
        links={"self": prefix, "trials": f"{prefix}/trials", "report": f"{prefix}/report",
               "cancel": f"{prefix}/cancel"},
    )


def _rows(rng: random.Random, count: int) -> list[dict]:
    start = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
    rows = []
    for n in range(count):
        state = STATES[n % len(STATES)]
        total = rng.choice((0, 1, 7, 10))
        done = rng.randint(0, total)
        failed = rng.randint(0, total - done)
        created = start + timedelta(seconds=n * 37, microseconds=0 if n % 4 == 0 else rng.randint(1, 999_999))
        started = created + timedelta(seconds=5) if state != "queued" else None
        ended = state in ("succeeded", "failed", "cancelled")
        best = rng.choice((None, 0.5, 1e-7, 123456789.125, 3.0, 2 / 3))
        rows.append({
            "id": f"s{n:03d}{rng.getrandbits(24):06x}", "name": f"sweep-{n}.v{n % 3}",
            "owner": ("alice", "bob", "carol")[n % 3], "state": state,
            "spec": {"name": f"sweep-{n}"}, "request_hash": "0" * 64,
            "idempotency_key": f"key-{n}" if n % 2 else None, "created_at": created,
            "started_at": started, "finished_at": created + timedelta(minutes=3) if ended else None,
            "updated_at": created + timedelta(seconds=n), "total": total,
            "pending": total - done - failed, "running": 0, "done": done, "failed": failed,
            "stopped": 0, "best_metric": "val/latent_nmi" if best is not None else None,
            "best_value": best, "best_trial": f"t_{n:05d}" if best is not None else None,
            "best_config": {"alpha": n / 4, "loss_stack": "ncc", "model": "discrete", "seed": n}
            if best is not None else None,
            "eta_seconds": rng.choice((None, 0.0, 12.5, float("inf"))),
            "error": 'ValueError: "α" went\nwrong\t(ß) \\ done' if state == "failed" else None,
            "experiment_id": str(n) if started else None,
            "parent_run_id": f"{n:032x}" if started and n % 3 else None,
            "report": {"cells": []} if ended else None,
            "launcher": "local" if started else None,
            "driver_handle": f"pid:{1000 + n}@host" if started else None,
            "attempts": 1 if started else 0, "heartbeat_at": None,
        })
    return rows


@pytest.fixture(scope="module", params=[
    "sqlite",
    pytest.param("postgres", marks=[pytest.mark.slow, pytest.mark.skipif(
        postgres_bin() is None, reason="Postgres binaries not installed")]),
])
def seeded(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("documents")
    server = None
    if request.param == "postgres":
        server = Postgres(folder)
        server.start()
    url = server.url if server is not None else f"sqlite:///{folder / 'service.db'}"
    store = Store(url)
    rows = _rows(random.Random(20261204), 60)
    with store.session.begin() as session:
        session.execute(insert(SweepRow), rows)
    yield store, [row["id"] for row in rows]
    store.close()
    if server is not None:
        server.remove()


def _bytes(model) -> bytes:
    return model.__pydantic_serializer__.to_json(model)


def test_a_sweeps_json_is_its_pydantic_documents_bytes(seeded):
    store, ids = seeded
    for sweep_id in ids:
        expected = _bytes(reference(store.get_sweep(sweep_id)))
        assert documents.sweep_json(store.summary(sweep_id), UI) == expected
        # the model the other endpoints return (submission, cancel) says the same
        assert _bytes(documents.sweep_resource(store.get_sweep_summary(sweep_id), UI)) == expected
    assert store.summary("no-such-sweep") is None


@pytest.mark.parametrize(("state", "owner", "limit", "offset"), [
    (None, None, 50, 0), (None, None, 7, 3), ("failed", None, 500, 0), (None, "bob", 5, 2),
    ("running", "alice", 50, 0), (None, None, 50, 100),
])
def test_a_list_pages_json_is_its_pydantic_documents_bytes(seeded, state, owner, limit, offset):
    store, _ = seeded
    page = store.list_sweeps(state=state, owner=owner, limit=limit, offset=offset)
    # the same rows, in the same order, through the ORM: newest first, ties by id
    with store.session() as session:
        every = [row for row in session.query(SweepRow).all()
                 if (state is None or row.state == state) and (owner is None or row.owner == owner)]
    every.sort(key=lambda row: row.id)
    every.sort(key=lambda row: row.created_at, reverse=True)
    expected = SweepPage(items=[reference(row) for row in every[offset:offset + limit]],
                         total=len(every), limit=limit, offset=offset)
    assert documents.page_json(page.items, page.total, limit, offset, UI) == _bytes(expected)


@pytest.mark.parametrize("value", [
    "2026-12-03 16:31:20.170000", "2026-12-03 16:31:20.000000", "2026-12-03 16:31:20.000001",
    "2026-12-03 16:31:20", "2026-12-03T16:31:20.1Z", "2026-12-03 16:31:20.500000+00:00",
    datetime(2026, 12, 3, 16, 31, 20, tzinfo=UTC), datetime(2026, 12, 3, 16, 31, 20, 7),
    datetime(2026, 12, 3, 16, 31, 20, 123456, tzinfo=timezone(timedelta(hours=-5))), None,
])
def test_json_time_writes_what_pydantic_writes(value):
    field = TypeAdapter(Sweep.model_fields["finished_at"].annotation)  # a Sweep's time field
    expected = field.dump_python(field.validate_python(utc_time(value)), mode="json")
    assert documents.json_time(value) == expected

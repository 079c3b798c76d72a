"""A sweep's extensions in a real SQLite store: the migration keeps every stored sweep, an
extension is appended only while the sweep holds the count it was read with, and a driver ends
the sweep only while it holds the extensions the driver ran."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command
from alembic.config import Config

import service.store.db as db
from service.orchestrator.sweep_process import refresher, reusable_sweeps
from service.store.queries import Store
from sweeps.status import SweepStatus


def _alembic(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(db.__file__).parent / "migrations"))
    config.set_main_option("sqlalchemy.url", url)
    return config


def _sweep(store: Store, sweep_id: str, owner: str = "alice", spec: dict | None = None) -> None:
    store.create_sweep(sweep_id=sweep_id, owner=owner, name=sweep_id,
                       spec=spec or {"name": sweep_id, "seeds": 3}, request_hash="h",
                       idempotency_key=None, total=6)


def test_the_migration_keeps_stored_sweeps(tmp_path):
    url = f"sqlite:///{tmp_path / 'service.db'}"
    command.upgrade(_alembic(url), "0004")  # the schema before extensions
    with sqlite3.connect(tmp_path / "service.db") as connection:
        connection.execute(
            "INSERT INTO sweeps (id, name, owner, state, spec, request_hash, created_at, "
            "updated_at, total, pending, running, done, failed, stopped, attempts, report) "
            "VALUES ('old', 'old', 'alice', 'succeeded', '{\"name\": \"old\"}', 'h', "
            "'2026-12-01 10:00:00', '2026-12-01 11:00:00', 6, 0, 0, 6, 0, 0, 1, "
            "'{\"sweep_id\": \"old\"}')")
    store = Store(url)  # migrates to the head
    try:
        row = store.get_sweep("old")
        assert (row.state, row.done, row.spec, row.report) == (
            "succeeded", 6, {"name": "old"}, {"sweep_id": "old"})
        assert (row.extensions, row.extension_count) == (None, 0)
    finally:
        store.close()
    command.downgrade(_alembic(url), "0004")  # and back: the row is still there
    with sqlite3.connect(tmp_path / "service.db") as connection:
        assert connection.execute("SELECT state FROM sweeps WHERE id = 'old'").fetchone() == (
            "succeeded",)


def test_extensions_are_appended_on_the_count_read_and_reopen_an_ended_sweep(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'service.db'}")
    try:
        _sweep(store, "s1")
        store.publish_status(SweepStatus("s1", total=6, done=0, pending=6))  # not running: ignored
        assert store.mark_launched("s1", launcher="local", handle="pid:1@h", attempts=1)
        ended = SweepStatus("s1", state="succeeded", total=6, done=6)
        assert store.publish_status(ended, report={"n": 1}, extension_count=0)
        record = {"number": 1, "added": {"seeds": [3]}}
        grown = {"name": "s1", "seeds": 4}
        states = ("queued", "running", "succeeded", "failed")
        assert not store.extend_sweep("s1", expected_count=1, spec=grown, record=record,
                                      total=8, from_states=states)  # read with another count
        assert not store.extend_sweep("s1", expected_count=0, spec=grown, record=record,
                                      total=8, from_states=("running",))  # not in those states
        assert store.extend_sweep("s1", expected_count=0, spec=grown, record=record,
                                  total=8, from_states=states)
        row = store.get_sweep("s1")
        assert (row.state, row.extension_count, row.extensions, row.spec) == (
            "queued", 1, [record], grown)
        assert (row.total, row.pending, row.done, row.finished_at, row.attempts) == (8, 2, 6, None, 0)
        assert row.report == {"n": 1}  # kept until the new one replaces it
        # The driver that ran no extension cannot end the sweep; the one that ran it can.
        assert store.mark_launched("s1", launcher="local", handle="pid:2@h", attempts=1)
        ended = SweepStatus("s1", state="succeeded", total=8, done=8)
        assert not store.publish_status(ended, report={"n": 2}, extension_count=0)
        spec, records = refresher(store, "s1")(0)
        assert (spec.seed_list(), records) == ([0, 1, 2, 3], [record])
        assert refresher(store, "s1")(1) is None
        assert store.publish_status(ended, report={"n": 2}, extension_count=1)
        assert store.get_sweep("s1").report == {"n": 2}
    finally:
        store.close()


def test_reuse_reads_the_owners_or_every_sweep(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'service.db'}")
    try:
        _sweep(store, "a1")
        _sweep(store, "b1", owner="bob")
        for reuse in ("none", "own", "visible"):
            _sweep(store, reuse, spec={"name": reuse, "reuse": reuse})
        found = {reuse: reusable_sweeps(store, store.get_sweep(reuse))
                 for reuse in ("none", "own", "visible")}
        assert found["none"] == frozenset()
        assert found["own"] == {"a1", "none", "own", "visible"}  # alice's
        assert found["visible"] == {"a1", "b1", "none", "own", "visible"}  # every sweep
    finally:
        store.close()

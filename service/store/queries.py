"""What the service and its drivers do with the store: every query in one place.

State changes are conditional updates (``... WHERE state = 'running'``), so a driver's
late progress report can never revive a sweep that was cancelled or already finished,
and two supervisors can never both start the same queued sweep.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    DateTime,
    Integer,
    Row,
    Select,
    String,
    bindparam,
    func,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.lifecycle import ACTIVE_SWEEP_STATES
from service.store.columns import DOCUMENT_COLUMNS
from service.store.db import (
    SweepRow,
    TrialRow,
    make_engine,
    make_sessionmaker,
    migrate,
    utcnow,
)
from sweeps.status import COUNTERS, SweepState, SweepStatus


def _summary_column(column: Any) -> Any:
    # Times as the driver hands them over: SQLAlchemy parses SQLite's text timestamps with a
    # regular expression in Python, four per sweep, which cost as much as the rest of a page
    # of 50; the API parses or rewrites them itself. Postgres drivers give datetimes.
    if isinstance(column.type, DateTime):
        return type_coerce(column, String).label(column.name)
    return column


# A sweep without its two big JSON documents (spec, report), as a Core row: what the API checks
# before it acts on a sweep (cancel, trials, report), through a statement built once with
# bound parameters (building and cache-keying a select of 28 columns costs more than running it).
_SUMMARY_COLUMNS = tuple(_summary_column(c) for c in SweepRow.__table__.c
                         if c.name not in ("spec", "report", "extensions"))
_SUMMARY_BY_ID = select(*_SUMMARY_COLUMNS).where(SweepRow.id == bindparam("sweep_id"))


def _list_queries(by_state: bool, by_owner: bool, columns: tuple[Any, ...]) -> tuple[Select, Select]:
    page = select(*columns)
    counted = select(func.count()).select_from(SweepRow)
    for wanted, column in ((by_state, SweepRow.state), (by_owner, SweepRow.owner)):
        if wanted:
            page = page.where(column == bindparam(column.name))
            counted = counted.where(column == bindparam(column.name))
    page = (page.order_by(SweepRow.created_at.desc(), SweepRow.id)
            .limit(bindparam("limit", type_=Integer)).offset(bindparam("offset", type_=Integer)))
    return page, counted


_BY_NAME = {column.name: column for column in _SUMMARY_COLUMNS}
_DOCUMENT_BY_ID = select(*(_BY_NAME[name] for name in DOCUMENT_COLUMNS)).where(
    SweepRow.id == bindparam("sweep_id"))
_DOCUMENT_PAGES = {(s, o): _list_queries(s, o, tuple(_BY_NAME[name] for name in DOCUMENT_COLUMNS))
                   for s in (False, True) for o in (False, True)}

# POST /sweeps: the Idempotency-Key look-up and the owner's active sweeps (the per-owner cap).
_BY_IDEMPOTENCY_KEY = select(SweepRow).where(SweepRow.owner == bindparam("owner"),
                                             SweepRow.idempotency_key == bindparam("key"))
_ACTIVE_OF_OWNER = select(func.count()).select_from(SweepRow).where(
    SweepRow.owner == bindparam("owner"),
    or_(*(SweepRow.state == state for state in ACTIVE_SWEEP_STATES)))  # not IN: no per-call expansion


class _DriverQuery:
    """A select compiled once for one dialect and run on a pooled DBAPI connection.

    The hot reads (GET /sweeps/{id}, GET /sweeps) run a fixed statement per request; through
    SQLAlchemy's Core execution (cache look-up, execution context, result processing) that cost
    three to five times what SQLite itself spends. Rows come back as the driver gives them:
    SQLite's times and JSON as text, Postgres's as datetimes and decoded JSON.
    """

    def __init__(self, statement: Select, dialect: Any) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = compiled.string
        self.order = tuple(compiled.positiontup or ()) if compiled.positional else None

    def parameters(self, values: dict[str, Any]) -> Any:
        return values if self.order is None else tuple(values[name] for name in self.order)


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different request body."""

    def __init__(self, sweep_id: str) -> None:
        super().__init__(sweep_id)
        self.sweep_id = sweep_id


@dataclass
class Page:
    items: list[Any]
    total: int


class Store:
    """The SQL store of sweeps and trials (SQLite or Postgres)."""

    def __init__(self, url: str, *, apply_migrations: bool = True) -> None:
        self.url = url
        if apply_migrations:
            migrate(url)
        self.engine = make_engine(url)
        self.session = make_sessionmaker(self.engine)
        # One writer at a time within the process: concurrent submissions queue here and
        # wake at once, instead of in SQLite's busy-wait sleeps of up to 100 ms.
        self._write_lock = threading.Lock()
        self.generation = 0  # bumped by every write made through this Store
        dialect = self.engine.dialect
        self._summary_by_id = _DriverQuery(_DOCUMENT_BY_ID, dialect)
        self._summary_pages = {key: (_DriverQuery(page, dialect), _DriverQuery(counted, dialect))
                               for key, (page, counted) in _DOCUMENT_PAGES.items()}

    @contextmanager
    def writing(self, *, changes_sweeps: bool = True) -> Iterator[Session]:
        """A write transaction, under the process's write lock. ``changes_sweeps=False`` (the
        supervisor lease's renewals) leaves :attr:`generation`, and so cached pages, alone."""
        with self._write_lock, self.session.begin() as session:
            if changes_sweeps:
                self.generation += 1
            yield session

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def ping(self) -> None:
        with self.session() as session:
            session.execute(select(1))

    def close(self) -> None:
        self.engine.dispose()

    # ---- sweeps -------------------------------------------------------------------------

    def create_sweep(self, *, sweep_id: str, owner: str, name: str, spec: dict[str, Any],
                     request_hash: str, idempotency_key: str | None, total: int) -> tuple[SweepRow, bool]:
        """Store a queued sweep; returns it and True.

        The caller looks an Idempotency-Key up first (:meth:`find_by_idempotency_key`); when a
        concurrent request with the same key wins the race to insert, this returns that
        request's sweep and False for the same body, and raises :class:`IdempotencyConflict`
        for another body.
        """
        row = SweepRow(id=sweep_id, owner=owner, name=name, state=SweepState.QUEUED.value, spec=spec,
                       request_hash=request_hash, idempotency_key=idempotency_key,
                       total=total, pending=total, attempts=0)
        try:
            with self.writing() as session:
                session.add(row)
        except IntegrityError:
            earlier = self.find_by_idempotency_key(owner, idempotency_key or "")
            if earlier is None:
                raise
            return self._replay(earlier, request_hash), False
        return row, True

    @staticmethod
    def _replay(earlier: SweepRow, request_hash: str) -> SweepRow:
        if earlier.request_hash != request_hash:
            raise IdempotencyConflict(earlier.id)
        return earlier

    def find_by_idempotency_key(self, owner: str, key: str) -> SweepRow | None:
        with self.session() as session:
            return session.scalars(_BY_IDEMPOTENCY_KEY, {"owner": owner, "key": key}).first()

    def get_sweep(self, sweep_id: str) -> SweepRow | None:
        with self.session() as session:
            return session.get(SweepRow, sweep_id)

    def get_sweep_summary(self, sweep_id: str) -> Row | None:
        """The sweep without its two big JSON columns (spec, report): what GET /sweeps/{id} shows."""
        with self.engine.connect() as connection:
            return connection.execute(_SUMMARY_BY_ID, {"sweep_id": sweep_id}).first()

    def summary(self, sweep_id: str) -> tuple[Any, ...] | None:
        """GET /sweeps/{id}'s row: the values of :data:`DOCUMENT_COLUMNS` as the DBAPI gives them
        (on SQLite times and JSON as text; on Postgres datetimes and decoded JSON), or None."""
        query = self._summary_by_id
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(query.sql, query.parameters({"sweep_id": sweep_id}))
            row = cursor.fetchone()
            cursor.close()
        finally:
            connection.close()
        return None if row is None else tuple(row)

    def list_sweeps(self, *, state: str | None = None, owner: str | None = None,
                    limit: int = 50, offset: int = 0) -> Page:
        """A page of sweeps, newest first, each as :meth:`summary` gives it, and the total."""
        page, counted = self._summary_pages[state is not None, owner is not None]
        values = {"state": state, "owner": owner, "limit": limit, "offset": offset}
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(counted.sql, counted.parameters(values))
            total = cursor.fetchone()[0] or 0
            cursor.execute(page.sql, page.parameters(values))
            rows = cursor.fetchall()
            cursor.close()
        finally:
            connection.close()
        return Page(rows, total)

    def count_active(self, owner: str) -> int:
        """The owner's queued and running sweeps (from the index on owner and state)."""
        with self.engine.connect() as connection:
            return connection.execute(_ACTIVE_OF_OWNER, {"owner": owner}).scalar() or 0

    def sweep_ids(self, owner: str | None = None) -> list[str]:
        """Every sweep's id, or only ``owner``'s."""
        query = select(SweepRow.id)
        if owner is not None:
            query = query.where(SweepRow.owner == owner)
        with self.engine.connect() as connection:
            return list(connection.execute(query).scalars())

    def sweeps_in_state(self, state: str) -> list[SweepRow]:
        """Sweeps in ``state``, oldest first (the queue order)."""
        with self.session() as session:
            return list(session.scalars(select(SweepRow).where(SweepRow.state == state)
                                        .order_by(SweepRow.created_at, SweepRow.id)))

    def count_in_state(self, state: str) -> int:
        with self.session() as session:
            return session.scalar(select(func.count()).select_from(SweepRow)
                                  .where(SweepRow.state == state)) or 0

    def _transition(self, sweep_id: str, from_states: Sequence[str], **values: Any) -> bool:
        values.setdefault("updated_at", utcnow())
        with self.writing() as session:
            result = session.execute(update(SweepRow).where(
                SweepRow.id == sweep_id, SweepRow.state.in_(tuple(from_states))).values(**values))
            return result.rowcount == 1

    def mark_launched(self, sweep_id: str, *, launcher: str, handle: str, attempts: int,
                      from_states: Sequence[str] = (SweepState.QUEUED.value,)) -> bool:
        """queued -> running (or a restart of a running sweep) with its new driver."""
        now = utcnow()
        values: dict[str, Any] = {"state": SweepState.RUNNING.value, "launcher": launcher, "driver_handle": handle,
                                  "attempts": attempts, "heartbeat_at": now}
        row = self.get_sweep(sweep_id)
        if row is not None and row.started_at is None:
            values["started_at"] = now
        return self._transition(sweep_id, from_states, **values)

    def set_driver_handle(self, sweep_id: str, handle: str) -> None:
        with self.writing() as session:
            session.execute(update(SweepRow).where(SweepRow.id == sweep_id)
                            .values(driver_handle=handle))

    def finish(self, sweep_id: str, state: str, *, error: str | None = None,
               from_states: Sequence[str] = ACTIVE_SWEEP_STATES) -> bool:
        """Move an active sweep to a terminal state (False when it was not active)."""
        values: dict[str, Any] = dict(state=state, finished_at=utcnow(), eta_seconds=0.0,
                                      running=0)  # the running counter's column
        if error is not None:
            values["error"] = error[:5000]
        return self._transition(sweep_id, from_states, **values)

    # ---- progress from drivers ---------------------------------------------------------------

    def publish_status(self, status: SweepStatus, report: dict[str, Any] | None = None,
                       extension_count: int | None = None) -> bool:
        """Record a driver's progress; a terminal status also ends the sweep.

        Only a running sweep is updated: False means the sweep was cancelled (or ended)
        under the driver, which should then stop, or (a terminal status with
        ``extension_count``) it was extended past the extensions the driver ran.
        """
        now = utcnow()
        values: dict[str, Any] = {name: int(getattr(status, name)) for name in COUNTERS}
        best = status.best_value
        values.update(
            best_metric=status.best_metric,
            best_value=best if best is not None and math.isfinite(best) else None,
            best_trial=status.best_trial, best_config=status.best_config,
            eta_seconds=status.eta_seconds, experiment_id=status.experiment_id,
            parent_run_id=status.parent_run_id, heartbeat_at=now, updated_at=now,
        )
        if status.state in (SweepState.SUCCEEDED, SweepState.FAILED):
            values.update(state=status.state, finished_at=now, error=status.error, running=0)
            if report is not None:
                values["report"] = report
        conditions = [SweepRow.id == status.sweep_id, SweepRow.state == SweepState.RUNNING.value]
        if "state" in values and extension_count is not None:
            conditions.append(SweepRow.extension_count == extension_count)
        with self.writing() as session:
            result = session.execute(update(SweepRow).where(*conditions).values(**values))
            if result.rowcount != 1:
                return False
            self._upsert_trials(session, status.sweep_id, status.trials, now)
        return True

    @staticmethod
    def _upsert_trials(session: Any, sweep_id: str, trials: list[dict[str, Any]],
                       now: datetime) -> None:
        existing = {row.trial_id: row for row in session.scalars(
            select(TrialRow).where(TrialRow.sweep_id == sweep_id))}
        for position, record in enumerate(trials):
            values = {"position": position, "state": record["state"], "config": record["config"],
                      "metrics": record["metrics"], "epochs": record.get("epochs", 0),
                      "mlflow_run_id": record.get("mlflow_run_id"), "error": record.get("error"),
                      "updated_at": now}
            row = existing.get(record["trial_id"])
            if row is None:
                session.add(TrialRow(sweep_id=sweep_id, trial_id=record["trial_id"], **values))
                continue
            if record.get("error") is None:
                values.pop("error")  # keep an error recorded earlier
            for key, value in values.items():
                setattr(row, key, value)

    # ---- growth ---------------------------------------------------------------------------

    def extend_sweep(self, sweep_id: str, *, expected_count: int, spec: dict[str, Any],
                     record: dict[str, Any], total: int, from_states: Sequence[str]) -> bool:
        """Append an extension: the union ``spec``, its ``record``, the new ``total``. Only
        while the sweep still has ``expected_count`` extensions and is in ``from_states``; a
        sweep that had ended is queued again (its driver starts afresh, its report stays until
        the new one replaces it). False when the sweep changed meanwhile."""
        now = utcnow()
        with self.writing() as session:
            row = session.get(SweepRow, sweep_id)
            if row is None or row.extension_count != expected_count or row.state not in from_states:
                return False
            ended = row.done + row.failed + row.stopped
            reopened = row.state not in ACTIVE_SWEEP_STATES
            values: dict[str, Any] = {
                "spec": spec, "extensions": [*(row.extensions or []), record],
                "extension_count": expected_count + 1, "total": total, "updated_at": now,
                # the counter's column: trials not started yet
                SweepRow.pending.key: max(0, total - ended - (0 if reopened else row.running))}
            if reopened:
                values.update(state=SweepState.QUEUED.value, finished_at=None, error=None,
                              eta_seconds=None, attempts=0, driver_handle=None, running=0)
            result = session.execute(update(SweepRow).where(
                SweepRow.id == sweep_id, SweepRow.extension_count == expected_count,
                SweepRow.state == row.state).values(**values))
            return result.rowcount == 1

    def list_trials(self, sweep_id: str, *, state: str | None = None, limit: int = 100,
                    offset: int = 0) -> Page:
        query = select(TrialRow).where(TrialRow.sweep_id == sweep_id)
        counted = select(func.count()).select_from(TrialRow).where(TrialRow.sweep_id == sweep_id)
        if state is not None:
            query, counted = query.where(TrialRow.state == state), counted.where(TrialRow.state == state)
        query = query.order_by(TrialRow.position, TrialRow.trial_id).limit(limit).offset(offset)
        with self.session() as session:
            return Page(list(session.scalars(query)), session.scalar(counted) or 0)


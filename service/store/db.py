"""The service store's tables (SQLAlchemy 2) and its engine.

SQLite by default (WAL mode, so drivers write progress while the API reads) or Postgres
through ``KSWEEP_DATABASE_URL``. The schema is owned by the Alembic migrations in
``service/migrations``, applied by :func:`migrate` when the API (or a driver) starts.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class SweepRow(Base):
    """One submitted sweep: its spec, where it stands, and who may act on it."""

    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    owner: Mapped[str] = mapped_column(String(100), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    request_hash: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Counters as the driver last published them; they add up to `total`.
    total: Mapped[int] = mapped_column(Integer, default=0)
    pending: Mapped[int] = mapped_column(Integer, default=0)
    running: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    stopped: Mapped[int] = mapped_column(Integer, default=0)
    best_metric: Mapped[str | None] = mapped_column(String(64))
    best_value: Mapped[float | None] = mapped_column(Float)
    best_trial: Mapped[str | None] = mapped_column(String(64))
    best_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    eta_seconds: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    experiment_id: Mapped[str | None] = mapped_column(String(64))
    parent_run_id: Mapped[str | None] = mapped_column(String(64))
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The driver: which launcher, its handle (pid@host or a Ray Job submission id), and how
    # many times it was (re)started; `attempts - 1` restarts after a driver died.
    launcher: Mapped[str | None] = mapped_column(String(16))
    driver_handle: Mapped[str | None] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[datetime | None]
    # A grown sweep's extension records (service/api/routes/growth.py), oldest first, and how
    # many there are: an extension and a driver's final status both check the count they read.
    extensions: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    extension_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_sweeps_owner_idempotency_key"),
        Index("ix_sweeps_state_created", "state", "created_at"),
        # The per-owner cap of POST /sweeps: an owner's active sweeps, counted from the index.
        Index("ix_sweeps_owner_state", "owner", "state"),
        # GET /sweeps: newest first, without sorting the whole table.
        Index("ix_sweeps_created_id", created_at.desc(), "id"),
    )


class TrialRow(Base):
    """One trial of a sweep as the driver last saw it."""

    __tablename__ = "trials"

    sweep_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True
    )
    trial_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    epochs: Mapped[int] = mapped_column(Integer, default=0)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class LeaseRow(Base):
    """A named lease (``supervisor``): who holds it and until when (Unix seconds).

    Several API processes share one store; only the holder of the ``supervisor`` lease runs
    the supervisor loop, renewing it every poll. A dead holder's lease expires and another
    process takes it over.
    """

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[float] = mapped_column(Float)
    acquired_at: Mapped[float] = mapped_column(Float)


SQLITE_POOL_SIZE = 40


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL: the API reads while drivers write. busy_timeout: writers queue instead of failing.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get WAL mode and their folder is created."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        pooled: dict[str, Any] = {}
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            pooled = {"pool_size": SQLITE_POOL_SIZE, "max_overflow": 10}
        # The pool holds a connection for every thread of the API's thread pool (anyio: 40):
        # with QueuePool's default 5 + 10 overflow, bursts of concurrent requests opened and
        # closed a connection each (connect + four pragmas), a fifth of a GET's server CPU.
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               **pooled)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)


def migrate(url: str) -> None:
    """Bring the store at ``url`` to the newest schema (Alembic ``upgrade head``)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(config, "head")

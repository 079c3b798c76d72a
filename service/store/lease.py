"""A lease in the store: at most one holder at a time, taken over once its holder stops renewing.

Several ``ksweep serve`` processes may share one store (SQLite or Postgres); each runs a
supervisor loop, but only the holder of the ``supervisor`` lease acts. Acquiring and renewing
are one conditional ``UPDATE ... WHERE holder = me OR expires_at < now`` (or the first
``INSERT``), atomic on both databases, so two processes can never both hold it. Times are the
processes' wall clocks (Unix seconds): processes on several hosts need synchronised clocks
(NTP), and a skew shortens or lengthens a takeover by that much.

The lease only keeps the standbys idle: every state change of a sweep is itself conditional
(``queued -> running`` once), so even two supervisors could not start a sweep twice.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import delete, or_, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from service.store.db import LeaseRow
from service.store.queries import Store

SUPERVISOR_LEASE = "supervisor"


def new_holder_id() -> str:
    """``host:pid:random``: unique per process start, and says where the holder runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseState:
    holder: str
    expires_at: float

    def valid(self, now: float | None = None) -> bool:
        return self.expires_at > (time.time() if now is None else now)


class Lease:
    """The lease ``name`` in ``store`` as seen by ``holder``, held for ``ttl_s`` per renewal."""

    def __init__(self, store: Store, holder: str, ttl_s: float, name: str = SUPERVISOR_LEASE) -> None:
        self.store, self.holder, self.ttl_s, self.name = store, holder, ttl_s, name

    def hold(self) -> bool:
        """Acquire or renew; True when this holder has the lease for the next ``ttl_s``."""
        now = time.time()
        try:
            with self.store.writing(changes_sweeps=False) as session:
                taken = session.execute(
                    update(LeaseRow)
                    .where(LeaseRow.name == self.name,
                           or_(LeaseRow.holder == self.holder, LeaseRow.expires_at < now))
                    .values(holder=self.holder, expires_at=now + self.ttl_s)
                    .execution_options(synchronize_session=False)
                ).rowcount
                if taken:
                    return True
                if session.get(LeaseRow, self.name) is not None:
                    return False  # held by someone else, not expired
                session.add(LeaseRow(name=self.name, holder=self.holder,
                                     expires_at=now + self.ttl_s, acquired_at=now))
            return True
        except (IntegrityError, OperationalError):
            return False  # another process inserted it first, or the store is busy: try again

    def release(self) -> None:
        """Give the lease up now (a clean shutdown), so that a standby takes over at once."""
        with self.store.writing(changes_sweeps=False) as session:
            session.execute(delete(LeaseRow).where(LeaseRow.name == self.name,
                                                   LeaseRow.holder == self.holder))

    def current(self) -> LeaseState | None:
        with self.store.session() as session:
            row = session.execute(select(LeaseRow.holder, LeaseRow.expires_at)
                                  .where(LeaseRow.name == self.name)).first()
        return LeaseState(row.holder, row.expires_at) if row is not None else None

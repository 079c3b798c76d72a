"""The dataset registry: canonical tables as objects of an :class:`~workers.object_store.ObjectStore`.

Layout under ``root`` (the object store's, with these files in each object)::

    objects/<sha256>/data.parquet   the canonical table (zstd), never rewritten
    objects/<sha256>/meta.json      {"sha256", "rows", "columns", "summary", "bytes", "tokenizer"}
    names/<name>.json               a DatasetRecord (owner, hash, summary, ...)
    tmp/staged.<id>/                a validated table waiting for :meth:`DatasetStore.commit`

No torch; the service and the workers share it. pyarrow is imported only by the methods that
read or write tables, so the API process (which lists, commits and removes) does not load it.
"""

from __future__ import annotations

import re
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from workers.contract import REGISTERED_NAME_PATTERN
from workers.datasets.limits import DatasetError
from workers.object_store import META_FILE, ObjectStore

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

DATA_FILE = "data.parquet"
ROW_GROUP_ROWS = 65_536
STAGING_ID_PATTERN = r"[0-9a-f]{32}"
STAGING_PATTERN = rf"staged\.{STAGING_ID_PATTERN}"


class DatasetNotFound(KeyError):
    """No dataset of that name (or no object of that hash) in the registry."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "dataset not found"


class DatasetConflict(ValueError):
    """The name is taken by other content (add with ``replace=True`` to move it)."""


class DatasetQuotaExceeded(ValueError):
    """The owner's datasets would take more than their disk quota."""


class StagedDataset(BaseModel):
    """A validated canonical table written under ``tmp/``, waiting for :meth:`DatasetStore.commit`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str
    rows: int
    columns: list[str]
    summary: dict[str, Any]
    bytes: int
    tokenizer: str | None = None
    staging: str


class DatasetRecord(BaseModel):
    """One registered name: who owns it and which content it points at."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    owner: str
    sha256: str
    created_at: datetime
    rows: int
    columns: list[str]
    summary: dict[str, Any]
    tokenizer: str | None = None
    bytes: int


class DatasetStore(ObjectStore[DatasetRecord]):
    """The registry under ``root`` (created on first write)."""

    kind = "dataset"
    record_model = DatasetRecord
    lock_timeout_s = 120  # an API request fails rather than waits on a stuck holder

    @classmethod
    def invalid_name(cls, name: object) -> DatasetError:
        return DatasetError(f"invalid dataset name {name!r}", file=None, column="name", row=None,
                            fix=f"use 1-64 characters matching {REGISTERED_NAME_PATTERN} (no / or \\)")

    def not_found(self, message: str) -> DatasetNotFound:
        return DatasetNotFound(message)

    def data_path(self, sha256: str) -> Path:
        """Where the canonical Parquet file of content ``sha256`` lies (may not exist)."""
        return self.object_dir(sha256) / DATA_FILE

    def stage(self, table: pa.Table, *, tokenizer: str | None = None,
              staging_id: str | None = None) -> StagedDataset:
        """Write a canonical table into ``tmp/staged.<id>`` (not yet visible); :meth:`commit`
        lands it.

        The upload's validation subprocess stages, the service commits: the service never
        reads the data itself. The service picks ``staging_id`` (32 hex digits) so that it can
        remove the folder of a child it had to kill (:meth:`discard_id`).
        """
        if staging_id is not None and not re.fullmatch(STAGING_ID_PATTERN, staging_id):
            raise ValueError(f"staging_id {staging_id!r} is not 32 hex digits")
        import pyarrow.parquet as pq

        from workers.datasets.table import content_hash, summarize

        sha = content_hash(table)
        self.tmp.mkdir(parents=True, exist_ok=True)
        staging = self.tmp / f"staged.{staging_id or uuid.uuid4().hex}"
        staging.mkdir()
        try:
            pq.write_table(table, staging / DATA_FILE, compression="zstd",
                           row_group_size=ROW_GROUP_ROWS)
            staged = StagedDataset(
                sha256=sha, rows=table.num_rows, columns=table.column_names,
                summary=summarize(table), bytes=(staging / DATA_FILE).stat().st_size,
                tokenizer=tokenizer, staging=staging.name,
            )
            (staging / META_FILE).write_text(staged.model_dump_json(indent=1, exclude={"staging"}))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return staged

    def _staging_dir(self, staged: StagedDataset) -> Path:
        if not re.fullmatch(STAGING_PATTERN, staged.staging):
            raise ValueError(f"not a staging folder of this store: {staged.staging!r}")
        return self.tmp / staged.staging

    def discard(self, staged: StagedDataset) -> None:
        """Drop a staged table that will not be committed."""
        shutil.rmtree(self._staging_dir(staged), ignore_errors=True)

    def discard_id(self, staging_id: str) -> None:
        """Drop whatever a (killed) stage of ``staging_id`` left behind; nothing if none."""
        if re.fullmatch(STAGING_ID_PATTERN, staging_id):
            shutil.rmtree(self.tmp / f"staged.{staging_id}", ignore_errors=True)

    def commit(self, staged: StagedDataset, *, name: str, owner: str, replace: bool = False,
               quota_bytes: int | None = None) -> tuple[DatasetRecord, bool]:
        """Point ``name`` at a staged table; returns the record and whether anything changed.

        Same name and same content: the existing record, unchanged (False). The staged folder
        is always consumed (moved or removed).

        Raises:
            DatasetConflict: the name holds other content and ``replace`` is false.
            DatasetQuotaExceeded: ``owner`` would hold over ``quota_bytes`` of objects.
        """
        self.check_name(name)
        staging = self._staging_dir(staged)
        try:
            with self.lock():
                old = self.read_record(name)
                if old is not None and old.sha256 == staged.sha256:
                    return old, False
                if old is not None and not replace:
                    raise DatasetConflict(
                        f"dataset {name!r} already holds other content (sha256 "
                        f"{old.sha256[:12]}, owner {old.owner}); add with replace to point it "
                        "at the new content")
                held = {r.sha256: r.bytes for r in self.list() if r.owner == owner}
                if quota_bytes is not None and staged.sha256 not in held \
                        and sum(held.values()) + staged.bytes > quota_bytes:
                    raise DatasetQuotaExceeded(
                        f"owner {owner!r} holds {sum(held.values())} bytes of datasets; "
                        f"{staged.bytes} more would pass the quota of {quota_bytes} "
                        "(KSWEEP_DATASET_QUOTA_BYTES); remove a dataset first")
                final = self.land(staging, staged.sha256, DATA_FILE)
                record = DatasetRecord(
                    name=name, owner=owner, sha256=staged.sha256, created_at=datetime.now(UTC),
                    rows=staged.rows, columns=staged.columns, summary=staged.summary,
                    tokenizer=staged.tokenizer, bytes=(final / DATA_FILE).stat().st_size,
                )
                self.write_record(record)
                if old is not None:
                    self.collect(old.sha256)
                return record, True
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def add(self, table: pa.Table, *, name: str, owner: str, tokenizer: str | None = None,
            replace: bool = False) -> DatasetRecord:
        """Register a canonical table (see :func:`workers.datasets.table.canonicalize`) under ``name``.

        Same name and same content: a no-op returning the existing record. Same name, other
        content: :class:`DatasetConflict` unless ``replace`` (then the name moves to the new
        content and the old object is dropped when no name uses it).

        Raises:
            DatasetError: an invalid name.
            DatasetConflict: the name holds other content and ``replace`` is false.
        """
        self.check_name(name)
        return self.commit(self.stage(table, tokenizer=tokenizer), name=name, owner=owner,
                           replace=replace)[0]

    def get(self, name: str) -> DatasetRecord:
        """The record of ``name``.

        Raises:
            DatasetNotFound: no dataset of that name.
            DatasetError: an invalid name.
        """
        record = self.read_record(name)
        if record is None:
            raise DatasetNotFound(f"no dataset named {name!r}; `ksweep data list` shows them")
        return record

    def owner_bytes(self, owner: str) -> int:
        """Bytes of the distinct objects ``owner``'s names point at (the per-owner quota)."""
        return sum({r.sha256: r.bytes for r in self.list() if r.owner == owner}.values())

    def remove(self, name: str) -> DatasetRecord:
        """Drop the name; its object goes too when no other name points at it.

        Raises:
            DatasetNotFound: no dataset of that name.
        """
        with self.lock():
            record = self.get(name)
            self.record_path(name).unlink()
            self.collect(record.sha256)
            return record

    def _existing_object(self, sha256: str) -> Path:
        path = self.data_path(sha256)
        if not path.exists():
            raise DatasetNotFound(f"no dataset object {sha256} under {self.objects}")
        return path

    def open_table(self, sha256: str) -> pa.Table:
        """The canonical table of content ``sha256``, memory-mapped.

        Raises:
            DatasetNotFound: no object of that hash.
        """
        import pyarrow.parquet as pq

        return pq.read_table(self._existing_object(sha256), memory_map=True)

    def parquet_file(self, sha256: str) -> pq.ParquetFile:
        """The stored object as a ``pyarrow.parquet.ParquetFile`` (row groups of 65,536 rows):
        ``iter_batches`` reads a first batch without decoding the rest.

        Raises:
            DatasetNotFound: no object of that hash.
        """
        import pyarrow.parquet as pq

        return pq.ParquetFile(self._existing_object(sha256), memory_map=True)

    def verify(self, sha256: str) -> bool:
        """True when the stored object's content still hashes to ``sha256``."""
        from workers.datasets.table import content_hash

        return content_hash(self.open_table(sha256)) == sha256

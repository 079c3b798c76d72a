"""Interim stand-in for developer `data`'s store (the agreed layout, no validation); replaced at merge."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel


class DatasetNotFound(KeyError):
    """No dataset has that name."""


class DatasetConflict(ValueError):
    """The name holds other content."""


class DatasetRecord(BaseModel):
    name: str
    owner: str
    sha256: str
    created_at: str
    rows: int
    columns: list[str]
    summary: dict[str, Any] = {}
    tokenizer: str | None = None
    bytes: int = 0


class DatasetStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def data_path(self, sha256: str) -> Path:
        return self.root / "objects" / sha256 / "data.parquet"

    def open_table(self, sha256: str) -> pa.Table:
        return pq.read_table(self.data_path(sha256), memory_map=True)

    def get(self, name: str) -> DatasetRecord:
        path = self.root / "names" / f"{name}.json"
        if not path.exists():
            raise DatasetNotFound(name)
        return DatasetRecord.model_validate_json(path.read_text())

    def list(self) -> list[DatasetRecord]:
        return [self.get(p.stem) for p in sorted((self.root / "names").glob("*.json"))]

    def add(self, table: pa.Table, *, name: str, owner: str,
            tokenizer: str | None = None, replace: bool = False) -> DatasetRecord:
        from workers.data.dataset_table import content_hash

        sha256 = content_hash(table)
        path = self.data_path(sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(dir=path.parent)
        os.close(handle)
        pq.write_table(table, staging)
        os.replace(staging, path)
        record = DatasetRecord(name=name, owner=owner, sha256=sha256,
                               created_at=datetime.now(UTC).isoformat(), rows=table.num_rows,
                               columns=table.column_names, bytes=path.stat().st_size)
        names = self.root / "names"
        names.mkdir(parents=True, exist_ok=True)
        (names / f"{name}.json").write_text(json.dumps(record.model_dump()))
        return record

"""The content-addressed object store under the dataset and the model registries.

Under ``root``: ``objects/<sha256>/`` (one immutable object: its files and ``meta.json``),
``names/<name>.json`` (a record: the name, its owner, its object's sha256), ``tmp/`` (staging:
an object lands by rename, a record by ``os.replace``) and ``.lock``. A crash or a refused write
leaves the store as it was. A name is 1-64 characters of
:data:`workers.contract.REGISTERED_NAME_PATTERN`, never a path. No pyarrow, no torch: the API
process lists, commits and removes through it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from filelock import FileLock
from pydantic import BaseModel

from workers.contract import REGISTERED_NAME_PATTERN, SHA256_HEX_PATTERN

__all__ = ["META_FILE", "ObjectStore", "atomic_write", "valid_name"]

META_FILE = "meta.json"  # each object's description, beside its files

Record = TypeVar("Record", bound=BaseModel)
_NAME = re.compile(REGISTERED_NAME_PATTERN)
_SHA256 = re.compile(SHA256_HEX_PATTERN)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never half."""
    temp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


def valid_name(name: object) -> bool:
    """Whether ``name`` may name a registered object (a string of the pattern, never a path)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


class ObjectStore(ABC, Generic[Record]):
    """Objects and named records under ``root`` (created on the first write).

    A registry subclasses it with its record model and its own errors: :meth:`invalid_name` and
    :meth:`not_found` build what a bad name or a missing object raises.
    """

    kind: ClassVar[str]  # what the messages call an object: "dataset", "model"
    record_model: ClassVar[type[BaseModel]]
    lock_timeout_s: ClassVar[float] = -1  # wait as long as the holder takes

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.names = self.root / "names"
        self.tmp = self.root / "tmp"

    @classmethod
    @abstractmethod
    def invalid_name(cls, name: object) -> Exception:
        """What a bad name raises (naming the rule)."""

    @abstractmethod
    def not_found(self, message: str) -> Exception:
        """What a missing name or object raises."""

    @classmethod
    def check_name(cls, name: str) -> str:
        """``name`` when it is a valid name, else the store's :meth:`invalid_name` is raised."""
        if not valid_name(name):
            raise cls.invalid_name(name)
        return name

    def lock(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".lock"), timeout=self.lock_timeout_s)

    def object_dir(self, sha256: str) -> Path:
        """The folder of object ``sha256`` (may not exist); :meth:`not_found` for a non-hash."""
        if not _SHA256.fullmatch(sha256 or ""):
            raise self.not_found(f"no {self.kind} object {sha256!r} (not a sha256 hex digest)")
        return self.objects / sha256

    def record_path(self, name: str) -> Path:
        return self.names / f"{self.check_name(name)}.json"

    def read_record(self, name: str) -> Record | None:
        path = self.record_path(name)
        if not path.exists():
            return None
        return self.record_model.model_validate_json(path.read_text())

    def write_record(self, record: Record) -> None:
        """Write ``record`` under its name, atomically (a reader sees the old or the new one)."""
        self.names.mkdir(parents=True, exist_ok=True)
        atomic_write(self.record_path(record.name), record.model_dump_json(indent=1))

    def list(self) -> list[Record]:
        """Every record, by name."""
        if not self.names.exists():
            return []
        return [self.record_model.model_validate_json(p.read_text())
                for p in sorted(self.names.glob("*.json"))]

    def staging_dir(self, prefix: str) -> Path:
        """A new empty folder under ``tmp/`` to build an object in before :meth:`land`."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{prefix}.", dir=self.tmp))

    def land(self, staging: Path, sha256: str, complete: str) -> Path:
        """Make ``staging`` object ``sha256`` (call holding :meth:`lock`). An object that already
        holds ``complete`` is kept and ``staging`` dropped; one without it (a crash before it was
        finished) is replaced."""
        target = self.object_dir(sha256)
        if (target / complete).exists():
            shutil.rmtree(staging, ignore_errors=True)
            return target
        self.objects.mkdir(parents=True, exist_ok=True)
        if target.exists():
            self._drop(target)
        os.replace(staging, target)
        return target

    def collect(self, sha256: str) -> None:
        """Drop object ``sha256`` when no record points at it (call holding :meth:`lock`)."""
        if any(r.sha256 == sha256 for r in self.list()):
            return
        target = self.objects / sha256
        if target.exists():
            self._drop(target)

    def _drop(self, folder: Path) -> None:
        # Renamed first, so a reader never sees half an object.
        self.tmp.mkdir(parents=True, exist_ok=True)
        grave = self.tmp / f"gone.{folder.name}.{uuid.uuid4().hex}"
        folder.rename(grave)
        shutil.rmtree(grave, ignore_errors=True)

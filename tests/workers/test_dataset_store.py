"""The on-disk dataset registry: content addressing, names, conflicts, removal."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from workers.datasets.store import (
    DatasetConflict,
    DatasetNotFound,
    DatasetQuotaExceeded,
    DatasetStore,
)
from workers.datasets.table import DatasetError, canonicalize, content_hash


def _table(last: int = 7) -> pa.Table:
    return canonicalize(pa.table({"y": [[1, 2], [3], [last]], "label": [0, 1, 0]}), "d.jsonl")


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_add_get_open_verify(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    record = store.add(_table(), name="toy", owner="ana")
    assert record.sha256 == content_hash(_table())
    assert record.rows == 3 and record.columns == ["y", "x", "label"]
    assert record.summary["label_classes"] == 2 and record.owner == "ana"
    assert store.get("toy") == record
    assert store.data_path(record.sha256).stat().st_size == record.bytes
    assert store.open_table(record.sha256).column("y").to_pylist() == [[1, 2], [3], [7]]
    assert store.verify(record.sha256)
    assert [r.name for r in store.list()] == ["toy"]
    assert not any((tmp_path / "tmp").iterdir())


def test_same_content_is_a_noop_other_content_conflicts(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    first = store.add(_table(), name="toy", owner="ana")
    assert store.add(_table(), name="toy", owner="ana") == first
    before = _tree(tmp_path)
    with pytest.raises(DatasetConflict, match="toy"):
        store.add(_table(8), name="toy", owner="ana")
    assert _tree(tmp_path) == before
    moved = store.add(_table(8), name="toy", owner="ana", replace=True)
    assert moved.sha256 != first.sha256
    assert not (tmp_path / "objects" / first.sha256).exists()  # no name points at it
    assert store.get("toy").sha256 == moved.sha256


def test_shared_object_survives_one_name_removed(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    a = store.add(_table(), name="a", owner="ana")
    store.add(_table(), name="b", owner="bo")
    assert store.owner_bytes("ana") == a.bytes and store.owner_bytes("cy") == 0
    store.remove("a")
    assert store.open_table(a.sha256).num_rows == 3
    store.remove("b")
    assert not (tmp_path / "objects" / a.sha256).exists()
    with pytest.raises(DatasetNotFound):
        store.get("b")
    with pytest.raises(DatasetNotFound):
        store.remove("b")
    with pytest.raises(DatasetNotFound):
        store.open_table(a.sha256)


@pytest.mark.parametrize("name", ["../etc", "a/b", "a\\b", "", ".", "..", ".hidden", "-x",
                                  "x" * 65, "a b", "naïve"])
def test_bad_names_refused(tmp_path: Path, name: str) -> None:
    store = DatasetStore(tmp_path)
    with pytest.raises(DatasetError) as info:
        store.add(_table(), name=name, owner="ana")
    assert info.value.column == "name" and "Fix:" in str(info.value)
    assert not (tmp_path / "names").exists() and not (tmp_path / "objects").exists()


def test_good_names_and_bad_hashes(tmp_path: Path) -> None:
    for name in ("a", "A.b-c_1", "x" * 64):
        assert DatasetStore.check_name(name) == name
    store = DatasetStore(tmp_path)
    with pytest.raises(DatasetNotFound):
        store.data_path("../../etc/passwd")


def test_stage_commit_quota_and_first_batch(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    staged = store.stage(_table(), tokenizer="bytes")
    assert store.list() == [] and (tmp_path / "tmp" / staged.staging).is_dir()
    with pytest.raises(DatasetQuotaExceeded, match="quota"):
        store.commit(staged, name="toy", owner="ana", quota_bytes=staged.bytes - 1)
    assert store.list() == [] and not any((tmp_path / "tmp").iterdir())
    record, created = store.commit(store.stage(_table(), tokenizer="bytes"), name="toy",
                                   owner="ana", quota_bytes=staged.bytes)
    assert created and record.tokenizer == "bytes"
    # The same content again costs no quota and changes nothing.
    again, created = store.commit(store.stage(_table()), name="toy", owner="ana", quota_bytes=1)
    assert again == record and not created and not any((tmp_path / "tmp").iterdir())
    store.discard(store.stage(_table(9)))
    assert not any((tmp_path / "tmp").iterdir())
    store.stage(_table(9), staging_id="ab" * 16)  # as a killed validation process leaves it
    assert (tmp_path / "tmp" / f"staged.{'ab' * 16}").is_dir()
    store.discard_id("ab" * 16)
    assert not any((tmp_path / "tmp").iterdir())
    with pytest.raises(ValueError, match="32 hex"):
        store.stage(_table(), staging_id="../../x")
    batch = next(store.parquet_file(record.sha256).iter_batches(2))
    assert batch.column(0).to_pylist() == [[1, 2], [3]]

"""The object store under both registries: stores written in today's layout read as before, an
unfinished object is replaced, a finished one kept, and a bad name refused with each store's error."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workers.datasets.limits import DatasetError
from workers.datasets.store import DatasetNotFound, DatasetStore
from workers.datasets.table import canonicalize, content_hash, summarize
from workers.lm.registry import ModelError, ModelNotFound, ModelStore, content_sha256


def _dataset_store_as_written_before(root: Path) -> str:
    """A registry laid out file by file as the dataset store has always written it."""
    table = canonicalize(pa.table({"y": [[1, 2], [3]], "label": [0, 1]}), "d.jsonl")
    sha = content_hash(table)
    folder = root / "objects" / sha
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "data.parquet", compression="zstd")
    size = (folder / "data.parquet").stat().st_size
    meta = {"sha256": sha, "rows": 2, "columns": table.column_names, "summary": summarize(table),
            "bytes": size, "tokenizer": None}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    (root / "names").mkdir()
    (root / "names" / "toy.json").write_text(json.dumps(
        {"name": "toy", "owner": "ana", "sha256": sha, "created_at": "2026-11-30T10:00:00Z",
         "rows": 2, "columns": table.column_names, "summary": summarize(table),
         "tokenizer": None, "bytes": size}, indent=1))
    (root / "tmp").mkdir()
    return sha


def _model_store_as_written_before(root: Path) -> dict[str, object]:
    """A model registry laid out as the model store has always written it (indent 2, files/)."""
    weights = b"not really safetensors"
    files = {"config.json": hashlib.sha256(b"{}").hexdigest(),
             "model.safetensors": hashlib.sha256(weights).hexdigest()}
    sha = content_sha256(files)
    record = {"name": "tiny", "owner": "local", "sha256": sha, "format": "hf", "gguf_file": None,
              "files": files, "bytes": 2 + len(weights), "tokenizer_sha256": "ab" * 32,
              "vocab_size": 10, "created_at": "2026-11-30T10:00:00+00:00", "source": "/somewhere"}
    folder = root / "objects" / sha
    (folder / "files").mkdir(parents=True)
    (folder / "files" / "config.json").write_bytes(b"{}")
    (folder / "files" / "model.safetensors").write_bytes(weights)
    (folder / "meta.json").write_text(json.dumps(record, indent=2))
    (root / "names").mkdir()
    (root / "names" / "tiny.json").write_text(json.dumps(record, indent=2))
    return record


def test_a_dataset_store_written_before_reads_and_writes_on(tmp_path: Path) -> None:
    sha = _dataset_store_as_written_before(tmp_path)
    store = DatasetStore(tmp_path)
    record = store.get("toy")
    assert (record.owner, record.sha256, record.rows) == ("ana", sha, 2)
    assert [r.name for r in store.list()] == ["toy"]
    assert store.open_table(sha).column("y").to_pylist() == [[1, 2], [3]]
    assert store.verify(sha)
    table = store.open_table(sha)
    assert store.add(table, name="copy", owner="bo").sha256 == sha  # the object is shared
    store.remove("toy")
    assert store.open_table(sha).num_rows == 2
    store.remove("copy")
    with pytest.raises(DatasetNotFound):
        store.open_table(sha)


def test_a_model_store_written_before_reads_and_verifies(tmp_path: Path) -> None:
    record = _model_store_as_written_before(tmp_path)
    store = ModelStore(tmp_path)
    found = store.get("tiny")
    assert found.model_dump(mode="json") == record
    assert store.list() == [found]
    assert store.object_record(str(record["sha256"])) == found
    assert (store.model_path(found) / "model.safetensors").read_bytes() == b"not really safetensors"
    store.verify(found)
    (store.model_path(found) / "config.json").write_bytes(b"{ }")
    with pytest.raises(ModelError, match="config.json"):
        store.verify(found)


def test_an_unfinished_object_is_replaced_and_a_finished_one_kept(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    sha = "a" * 64
    stale = tmp_path / "objects" / sha
    stale.mkdir(parents=True)
    (stale / "half.bin").write_bytes(b"crash")
    staging = store.staging_dir("test")
    (staging / "done").write_text("1")
    with store.lock():
        target = store.land(staging, sha, "done")
    assert sorted(p.name for p in target.iterdir()) == ["done"] and not staging.exists()
    again = store.staging_dir("test")
    (again / "done").write_text("2")
    with store.lock():
        store.land(again, sha, "done")
    assert (target / "done").read_text() == "1" and not again.exists()
    assert not list(store.tmp.iterdir())  # nothing left behind


@pytest.mark.parametrize("name", ["../x", "", ".", "x" * 65, "a b"])
def test_a_bad_name_is_refused_by_each_store_with_its_error(tmp_path: Path, name: str) -> None:
    with pytest.raises(DatasetError) as refused:
        DatasetStore(tmp_path).get(name)
    assert refused.value.column == "name"
    with pytest.raises(ModelError, match="1-64 characters"):
        ModelStore(tmp_path).get(name)
    with pytest.raises(ModelNotFound):
        ModelStore(tmp_path).object_record("not-a-hash")
    assert not (tmp_path / "names").exists()


def test_the_dataset_names_import_from_their_homes_and_the_old_paths_are_gone() -> None:
    # workers/data/dataset_store.py and dataset_table.py re-exported these until their last
    # user (this test) moved here; docs/layout.md names the homes.
    import importlib

    from workers.datasets import read, store, table

    assert store.DatasetStore.__module__ == "workers.datasets.store"
    assert (table.canonicalize.__module__, table.tokenizer_of.__module__,
            read.read_table.__module__) == ("workers.datasets.table",) * 2 + ("workers.datasets.read",)
    for gone in ("workers.data.dataset_store", "workers.data.dataset_table"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(gone)

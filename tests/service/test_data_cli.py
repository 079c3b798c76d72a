"""``ksweep data add | list | show | rm`` against a real server, Hugging Face folders included,
and the sweep-side checks (an unknown or another owner's dataset; DELETE while a sweep uses it).
All on the paused service of tests/service/conftest.py (one start per pytest process), each test
under dataset names of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.service.conftest import ROOT, TOKENS, auth, tiny_spec

pytestmark = pytest.mark.slow


def ksweep(service, *args: str, owner: str = "alice") -> subprocess.CompletedProcess:
    env = {**os.environ, "KSWEEP_URL": service.url.removesuffix("/api/v1"),
           "KSWEEP_TOKEN": TOKENS[owner], "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "ksweep.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def registry(service) -> dict[str, bytes]:
    root = Path(service.env["KSWEEP_SWEEP_ROOT"]) / "datasets"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock" and "tmp" not in p.relative_to(root).parts}


def test_add_list_show_rm(paused_service, tmp_path: Path) -> None:
    service = paused_service
    source = tmp_path / "dialogues.parquet"
    pq.write_table(pa.table({"x": [[5, 6], []], "y": [[1, 2, 3], [4]], "label": [0, 1]}), source)
    added = ksweep(service, "data", "add", str(source), "--name", "dialogues", "--json")
    assert added.returncode == 0, added.stderr + added.stdout
    record = json.loads(added.stdout)
    assert record["rows"] == 2 and record["summary"]["vocab_size"] == 7
    listed = ksweep(service, "data", "list")
    assert "dialogues" in listed.stdout and record["sha256"][:12] in listed.stdout
    shown = ksweep(service, "data", "show", "dialogues")
    assert "labels (2 classes)" in shown.stdout and "vocabulary size 7" in shown.stdout
    before = registry(service)
    other = tmp_path / "other.jsonl"
    other.write_text('{"y": [9]}\n')
    conflict = ksweep(service, "data", "add", str(other), "--name", "dialogues")
    assert conflict.returncode == 2 and "replace" in conflict.stdout
    assert registry(service) == before
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"y": [1]}\n{"y": [2.0]}\n')
    refused = ksweep(service, "data", "add", str(bad), "--name", "bad")
    assert refused.returncode == 2
    assert "bad.jsonl" in refused.stdout and "'y'" in refused.stdout and "row 1" in refused.stdout
    assert registry(service) == before
    assert ksweep(service, "data", "rm", "dialogues", owner="bob").returncode != 0
    assert ksweep(service, "data", "rm", "dialogues").returncode == 0
    assert "dialogues" not in ksweep(service, "data", "list").stdout


def test_hugging_face_folders(paused_service, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    service = paused_service
    one = datasets.Dataset.from_dict({"y": [[1, 2], [3]], "label": ["a", "b"]})
    one.save_to_disk(str(tmp_path / "single"))
    splits = datasets.DatasetDict({"train": one, "validation": one,
                                   "test": one.select([0])})
    splits.save_to_disk(str(tmp_path / "dict"))
    single = ksweep(service, "data", "add", str(tmp_path / "single"), "--name", "hf1", "--json")
    assert single.returncode == 0, single.stdout + single.stderr
    assert json.loads(single.stdout)["rows"] == 2
    both = ksweep(service, "data", "add", str(tmp_path / "dict"), "--name", "hf2", "--json")
    assert both.returncode == 0, both.stdout + both.stderr
    assert json.loads(both.stdout)["summary"]["rows_per_split"] == {"train": 2, "val": 2, "test": 1}
    # A state.json naming a file outside the folder is refused on the client, before any upload.
    (tmp_path / "secret.arrow").write_bytes((tmp_path / "single" / "data-00000-of-00001.arrow")
                                            .read_bytes())
    state = json.loads((tmp_path / "single" / "state.json").read_text())
    state["_data_files"] = [{"filename": "../secret.arrow"}]
    (tmp_path / "single" / "state.json").write_text(json.dumps(state))
    before = registry(service)
    escaped = ksweep(service, "data", "add", str(tmp_path / "single"), "--name", "hf3")
    assert escaped.returncode == 2 and "outside the folder" in escaped.stdout
    assert registry(service) == before


def _dataset_specs_supported() -> bool:
    try:
        from workers.data.config import DatasetDataConfig  # noqa: F401  (developer datatrain's)
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _dataset_specs_supported(), reason="template.data.dataset not merged yet")
def test_sweeps_naming_datasets(paused_service, tmp_path: Path) -> None:
    service = paused_service
    source = tmp_path / "d.jsonl"
    source.write_text("".join(json.dumps({"y": [i % 5 + 1, 2], "label": i % 2}) + "\n"
                              for i in range(60)))
    assert ksweep(service, "data", "add", str(source), "--name", "mine").returncode == 0
    with service.client() as client:
        spec = tiny_spec("on-data", **{"template.data": {"dataset": "nowhere"}})
        missing = client.post("/sweeps", json=spec, headers=auth("alice"))
        assert missing.status_code == 422 and "nowhere" in missing.json()["detail"]
        spec = tiny_spec("on-data", **{"template.data": {"dataset": "mine"}})
        assert client.post("/sweeps", json=spec, headers=auth("bob")).status_code == 403
        queued = client.post("/sweeps", json=spec, headers=auth("alice"))
        assert queued.status_code == 201, queued.text
        before = registry(service)
        busy = client.delete("/datasets/mine", headers=auth("alice"))
        assert busy.status_code == 409 and queued.json()["id"] in busy.json()["detail"]
        assert registry(service) == before
        client.post(f"/sweeps/{queued.json()['id']}/cancel", headers=auth("alice"))
        assert client.delete("/datasets/mine", headers=auth("alice")).status_code == 200

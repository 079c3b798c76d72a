"""``ksweep data add --tokenizer MODEL`` and ``POST /datasets?tokenizer=MODEL``, and the data
commands without a service (the local store when KSWEEP_URL is not set), through the real CLI
and a real ``ksweep serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.service.conftest import ROOT, TOKENS, auth
from tests.service.test_lm_submit import spec
from tests.support.serve_process import free_port
from tests.support.tiny_lm import build_tiny_llama, text_table
from workers.datasets.store import DatasetStore
from workers.lm.registry import ModelStore, check_dataset_tokenizer
from workers.lm.tokenizer import ModelTextTokenizer

pytestmark = pytest.mark.slow


def cli(*args: str, root: Path, url: str | None = None) -> subprocess.CompletedProcess:
    """``ksweep ARGS`` with the sweep root ``root``; KSWEEP_URL only when ``url`` is given."""
    env = {k: v for k, v in os.environ.items() if k not in ("KSWEEP_URL", "KSWEEP_TOKEN")}
    env.update({"KSWEEP_SWEEP_ROOT": str(root), "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    env.pop("KSWEEP_DATA_ROOT", None)
    env.pop("KSWEEP_MODEL_ROOT", None)
    if url is not None:
        env.update({"KSWEEP_URL": url, "KSWEEP_TOKEN": TOKENS["alice"]})
    return subprocess.run([sys.executable, "-m", "ksweep.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("data-tokenizer")
    text, ids = folder / "words.parquet", folder / "ids.parquet"
    pq.write_table(text_table(30), text)
    pq.write_table(text_table(30).drop_columns(["x_text", "y_text"]).append_column(
        "y", pa.array([[4, 5]] * 30)), ids)
    return {"text": text, "ids": ids, "model": build_tiny_llama(folder / "tiny")}


def expected_ids(model_root: Path, table_path: Path) -> list[list[int]]:
    tok = ModelTextTokenizer.registered(model_root, "tiny")
    return tok.encode(pq.read_table(table_path).column("y_text").combine_chunks()).to_pylist()


def test_local_store_without_a_service(files: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "root"
    added = cli("model", "add", str(files["model"]), "--name", "tiny", root=root)
    assert added.returncode == 0, added.stdout + added.stderr
    # No KSWEEP_URL and nothing listening: the local store, never "cannot reach the service".
    record = cli("data", "add", str(files["text"]), "--name", "words", "--tokenizer", "tiny",
                 "--json", root=root)
    assert record.returncode == 0, record.stdout + record.stderr
    body = json.loads(record.stdout)
    model = ModelStore(root / "models").get("tiny")
    assert body["tokenizer"] == f"tiny@{model.tokenizer_sha256}" and body["owner"] == "local"
    store = DatasetStore(root / "datasets")
    table = store.open_table(store.get("words").sha256)
    assert table.column("y").to_pylist() == expected_ids(root / "models", files["text"])
    check_dataset_tokenizer("words", store.get("words").tokenizer, model)  # a causal_lm base takes it
    plain = cli("data", "add", str(files["text"]), "--name", "as-bytes", root=root)
    assert plain.returncode == 0 and "registered in the local store" in plain.stdout
    assert store.get("as-bytes").tokenizer == "bytes"
    listed = cli("data", "list", root=root)
    assert "words" in listed.stdout and f"tiny@{model.tokenizer_sha256[:8]}" in listed.stdout
    assert "as-bytes" in listed.stdout and "local store" in listed.stdout
    shown = cli("data", "show", "words", root=root)
    assert shown.returncode == 0 and "labels (3 classes)" in shown.stdout
    before = sorted(p.name for p in (root / "datasets" / "names").iterdir())
    no_text = cli("data", "add", str(files["ids"]), "--name", "ids", "--tokenizer", "tiny", root=root)
    assert no_text.returncode == 2 and "'y_text'" in no_text.stdout and "no text" in no_text.stdout
    unknown = cli("data", "add", str(files["text"]), "--name", "w2", "--tokenizer", "nope", root=root)
    assert unknown.returncode == 2 and "model 'nope' is not registered" in unknown.stdout
    taken = cli("data", "add", str(files["ids"]), "--name", "words", root=root)
    assert taken.returncode == 2 and "replace" in taken.stdout
    assert sorted(p.name for p in (root / "datasets" / "names").iterdir()) == before
    removed = cli("data", "rm", "as-bytes", root=root)
    assert removed.returncode == 0 and "local store" in removed.stdout
    assert cli("data", "show", "as-bytes", root=root).returncode == 2
    # --service asks the service, and says so when there is none.
    down = cli("data", "list", "--service", root=root,
               url=f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 4 and "cannot reach the service" in down.stdout


def test_service_tokenizes_with_its_model(files: dict[str, Path], make_service,
                                          tmp_path: Path) -> None:
    models = tmp_path / "admin-models"
    assert cli("model", "add", str(files["model"]), "--name", "tiny", root=tmp_path / "x",
               ).returncode == 0
    os.replace(tmp_path / "x" / "models", models)
    service = make_service(KSWEEP_MODEL_ROOT=str(models), KSWEEP_MAX_CONCURRENT_SWEEPS="0")
    url = service.url.removesuffix("/api/v1")
    added = cli("data", "add", str(files["text"]), "--name", "words", "--tokenizer", "tiny",
                "--json", root=tmp_path / "client", url=url)
    assert added.returncode == 0, added.stdout + added.stderr
    record = json.loads(added.stdout)
    fingerprint = ModelStore(models).get("tiny").tokenizer_sha256
    assert record["tokenizer"] == f"tiny@{fingerprint}" and record["owner"] == "alice"
    store = DatasetStore(tmp_path / "root" / "datasets")  # the service's store, not the client's
    assert store.open_table(record["sha256"]).column("y").to_pylist() == \
        expected_ids(models, files["text"])
    assert not (tmp_path / "client" / "datasets").exists()
    with service.client() as client:
        queued = client.post("/sweeps", json=spec("words", model="tiny"), headers=auth("alice"))
        assert queued.status_code == 201, queued.text  # the model check accepts its ids
        body = files["text"].read_bytes()
        headers = {**auth("alice"), "Content-Type": "application/vnd.apache.parquet"}
        unknown = client.post("/datasets", params={"name": "w2", "tokenizer": "nope"},
                              content=body, headers=headers)
        assert unknown.status_code == 422
        assert unknown.json()["errors"][0]["field"] == "tokenizer"
        assert "model 'nope' is not registered" in unknown.json()["errors"][0]["message"]
        no_text = client.post("/datasets", params={"name": "ids", "tokenizer": "tiny"},
                              content=files["ids"].read_bytes(), headers=headers)
        assert no_text.status_code == 422 and no_text.json()["errors"][0]["field"] == "y_text"
        assert sorted(r["name"] for r in client.get("/datasets").json()) == ["words"]

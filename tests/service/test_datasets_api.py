"""``/api/v1/datasets`` on a real ``ksweep serve``: registration, and every hostile upload refused
with the file, column and row named and the registry left as it was."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.service.conftest import ServiceProcess, auth
from tests.support.groups import datasets_service

PARQUET = {"Content-Type": "application/vnd.apache.parquet"}
JSONL = {"Content-Type": "application/x-ndjson"}
MAX_BYTES = 200_000
GOOD = {"y": [[1, 2], [3], [4, 5]], "x": [[], [1], [2]], "label": ["a", "b", "a"],
        "split": ["train", "val", "test"]}

pytestmark = [pytest.mark.slow, datasets_service]


def parquet_bytes(columns: dict, **options) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink, **options)
    return sink.getvalue()


def jsonl_bytes(rows: list[dict | str]) -> bytes:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows).encode() + b"\n"


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[ServiceProcess]:
    workdir = tmp_path_factory.mktemp("datasets")
    svc = ServiceProcess(workdir, KSWEEP_MAX_DATASET_BYTES=str(MAX_BYTES),
                         KSWEEP_MAX_DATASET_ROWS="5000", KSWEEP_MAX_DATASET_LINE_BYTES="4096",
                         KSWEEP_MAX_CONCURRENT_SWEEPS="0")
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture
def client(service: ServiceProcess) -> Iterator[httpx.Client]:
    with service.client() as c:
        yield c


def registry(service: ServiceProcess) -> dict[str, bytes]:
    """Every file of the registry but the lock and the staging area (which must be empty)."""
    root = Path(service.env["KSWEEP_SWEEP_ROOT"]) / "datasets"
    tmp = root / "tmp"
    assert not tmp.exists() or not [p for p in tmp.rglob("*") if p.is_file()], "leftover staging"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock" and tmp not in p.parents}


def upload(client: httpx.Client, name: str, body: bytes, headers: dict = PARQUET,
           owner: str = "alice", **params) -> httpx.Response:
    return client.post("/datasets", params={"name": name, **params}, content=body,
                       headers={**headers, **auth(owner)})


def test_register_list_show_remove(service: ServiceProcess, client: httpx.Client) -> None:
    created = upload(client, "good", parquet_bytes(GOOD), filename="good.parquet")
    assert created.status_code == 201, created.text
    record = created.json()
    assert record["owner"] == "alice" and record["rows"] == 3 and len(record["sha256"]) == 64
    assert record["summary"]["rows_per_split"] == {"train": 1, "val": 1, "test": 1}
    assert record["summary"]["labels"] == {"a": 2, "b": 1}
    # The same rows as JSONL: the same content hash; the same name and content is a no-op.
    again = upload(client, "good", jsonl_bytes([dict(zip(GOOD, r, strict=True))
                                                for r in zip(*GOOD.values(), strict=True)]), JSONL)
    assert again.status_code == 200 and again.json()["sha256"] == record["sha256"]
    assert client.get("/datasets/good").json() == record
    assert [d["name"] for d in client.get("/datasets").json()] == ["good"]
    assert client.get("/datasets", params={"owner": "bob"}).json() == []
    assert client.delete("/datasets/good", headers=auth("bob")).status_code == 403
    assert client.delete("/datasets/good", headers=auth("alice")).status_code == 200
    assert client.get("/datasets/good").status_code == 404
    assert registry(service) == {}


def test_text_columns_use_the_byte_tokenizer(client: httpx.Client) -> None:
    answer = upload(client, "text", jsonl_bytes([{"x_text": "hi", "y_text": "é"}]), JSONL)
    assert answer.status_code == 201, answer.text
    assert answer.json()["tokenizer"] == "bytes"
    assert answer.json()["summary"]["tokens"]["all"] == {"y": 2, "x": 2}
    assert client.delete("/datasets/text", headers=auth("alice")).status_code == 200


def test_conflict_and_replace(service: ServiceProcess, client: httpx.Client) -> None:
    first = upload(client, "taken", parquet_bytes(GOOD)).json()
    before = registry(service)
    other = parquet_bytes(dict(GOOD, y=[[9], [3], [4, 5]]))
    answer = upload(client, "taken", other)
    assert answer.status_code == 409 and "replace" in answer.json()["detail"]
    assert registry(service) == before
    moved = upload(client, "taken", other, replace="true")
    assert moved.status_code == 201 and moved.json()["sha256"] != first["sha256"]
    assert client.delete("/datasets/taken", headers=auth("admin")).status_code == 200


def _base(**columns) -> dict:
    return {"y": [[1], [2], [3]], **columns}


HOSTILE_PARQUET = [
    ("no-y", {"x": [[1]]}, "y", None, "no `y` column"),
    ("empty-y", {"y": [[1], [], [2]]}, "y", 1, "empty"),
    ("negative", {"y": [[1], [2], [-3]]}, "y", 2, "negative"),
    ("fractional", {"y": [[1.0], [2.5], [3.0]]}, "y", 1, "3.0 is not an id"),
    ("boolean", {"y": [[True]]}, "y", 0, "bool"),
    ("beyond-int64", {"y": pa.array([[1], [2**64 - 1]], pa.list_(pa.uint64()))}, "y", 1,
     "beyond int64"),
    ("nll-length", _base(base_nll=[[0.1], [0.2, 0.3], [0.1]]), "base_nll", 1, "has 2 values"),
    ("nll-nan", _base(base_nll=[[0.1], [0.2], [float("nan")]]), "base_nll", 2, "NaN"),
    ("nll-inf", _base(base_nll=[[float("inf")], [0.2], [0.1]]), "base_nll", 0, "infinite"),
    ("nll-negative", _base(base_nll=[[0.1], [-0.2], [0.1]]), "base_nll", 1, "negative"),
    ("split-other", _base(split=["train", "val", "holdout"]), "split", 2, "'holdout'"),
    ("split-empty", _base(split=["train", "val", "val"]), "split", None, "`test` empty"),
    ("label-float", _base(label=[0.5, 1.0, 2.0]), "label", 0, "int or string"),
]


@pytest.mark.parametrize(("name", "columns", "column", "row", "words"), HOSTILE_PARQUET,
                         ids=[c[0] for c in HOSTILE_PARQUET])
def test_hostile_parquet(service, client, name, columns, column, row, words) -> None:
    before = registry(service)
    answer = upload(client, name, parquet_bytes(columns), filename=f"{name}.parquet")
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert f"file '{name}.parquet'" in detail and f"column '{column}'" in detail
    assert words in detail and "Fix:" in detail
    assert (f"row {row}" in detail) if row is not None else ("row " not in detail)
    assert answer.json()["errors"][0]["field"].startswith(column)
    assert registry(service) == before
    assert client.get(f"/datasets/{name}").status_code == 404


HOSTILE_JSONL = [
    ("float-id", ['{"y": [1]}', '{"y": [3.0]}'], "y", 1, "3.0 is not an id"),
    ("true-id", ['{"y": [1]}', '{"y": [1, true]}'], "y", 1, "true"),
    ("huge-id", ['{"y": [1]}', '{"y": [' + "9" * 30 + "]}"], "y", 1, "beyond int64"),
    ("mixed-label", ['{"y": [1], "label": 3}', '{"y": [2], "label": "cat"}'], "label", 1,
     "mixes types"),
    ("nan-nll", ['{"y": [1], "base_nll": [0.5]}', '{"y": [2], "base_nll": [NaN]}'], "base_nll",
     1, "NaN"),
]


@pytest.mark.parametrize(("name", "lines", "column", "row", "words"), HOSTILE_JSONL,
                         ids=[c[0] for c in HOSTILE_JSONL])
def test_hostile_jsonl(service, client, name, lines, column, row, words) -> None:
    before = registry(service)
    answer = upload(client, name, jsonl_bytes(lines), JSONL, filename=f"{name}.jsonl")
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert f"file '{name}.jsonl'" in detail and f"column '{column}'" in detail
    assert f"row {row}" in detail and words in detail
    assert registry(service) == before


def test_wrong_format_truncated_and_bomb(service, client) -> None:
    before = registry(service)
    good = parquet_bytes(GOOD)
    cases = [
        ("json-as-parquet", jsonl_bytes([{"y": [1]}]), PARQUET, "not a readable parquet file"),
        ("parquet-as-jsonl", good, JSONL, "not a readable jsonl file"),
        ("truncated", good[: len(good) // 2], PARQUET, "truncated"),
        ("bomb", parquet_bytes({"y": [[7] * 1000] * 4000}, compression="zstd",
                               use_dictionary=False), PARQUET, "beyond the limit of 50:1"),
    ]
    for name, body, headers, words in cases:
        answer = upload(client, name, body, headers, filename=f"{name}.bin")
        assert answer.status_code == 422, (name, answer.text)
        assert f"file '{name}.bin'" in answer.json()["detail"] and words in answer.json()["detail"]
    assert registry(service) == before


def test_size_caps(service, client) -> None:
    before = registry(service)
    big = b"{" + b" " * MAX_BYTES + b"}\n"
    declared = upload(client, "big", big, JSONL)
    assert declared.status_code == 413 and "KSWEEP_MAX_DATASET_BYTES" in declared.json()["detail"]

    sent = 0

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streamed
        nonlocal sent
        while sent < 1000 * MAX_BYTES:  # "endless": the server must cut it, not drain it
            sent += 10_000
            yield b" " * 10_000

    streamed = client.post("/datasets", params={"name": "big"}, content=chunks(),
                           headers={**JSONL, **auth("alice")})
    assert streamed.status_code == 413, streamed.text
    assert streamed.headers["connection"] == "close" and sent < 100 * MAX_BYTES
    rows = upload(client, "rows", parquet_bytes({"y": [[1]] * 6000}), filename="rows.parquet")
    assert rows.status_code == 422 and "6000 rows" in rows.json()["detail"]
    long_line = jsonl_bytes(['{"y": [1]}', '{"y": [2]}', '{"y": [' + ",".join(["1"] * 3000) + "]}"])
    line = upload(client, "line", long_line, JSONL, filename="line.jsonl")
    assert line.status_code == 422 and "over 4096 bytes" in line.json()["detail"]
    assert "file 'line.jsonl'" in line.json()["detail"] and "row 2" in line.json()["detail"]
    assert registry(service) == before


@pytest.mark.parametrize("name", ["../x", "a%2Fb", "..", ".x", "a b", "x" * 65])
def test_bad_names(service, client, name) -> None:
    before = registry(service)
    answer = upload(client, name, parquet_bytes(GOOD))
    assert answer.status_code == 422 and "query.name" in answer.json()["detail"]
    assert "[A-Za-z0-9][A-Za-z0-9._-]{0,63}" in answer.json()["detail"]
    assert registry(service) == before


def test_media_and_auth(service, client) -> None:
    before = registry(service)
    multipart = client.post("/datasets", params={"name": "m"}, files={"f": ("d.parquet", b"x")},
                            headers=auth("alice"))
    assert multipart.status_code == 415 and "multipart" in multipart.json()["detail"]
    unknown = upload(client, "u", b"PAR1", {"Content-Type": "application/octet-stream"})
    assert unknown.status_code == 415 and "format=" in unknown.json()["detail"]
    anonymous = client.post("/datasets", params={"name": "a"}, content=parquet_bytes(GOOD),
                            headers=PARQUET)
    assert anonymous.status_code == 401
    with_format = upload(client, "f", parquet_bytes(GOOD),
                         {"Content-Type": "application/octet-stream"}, format="parquet")
    assert with_format.status_code == 201
    assert client.delete("/datasets/f", headers=auth("alice")).status_code == 200
    assert registry(service) == before


def test_quota_and_memory_limit(make_service) -> None:
    svc = make_service(KSWEEP_DATASET_QUOTA_BYTES="3000")
    with svc.client() as client:
        assert upload(client, "one", parquet_bytes(GOOD)).status_code == 201
        before = registry(svc)
        other = parquet_bytes({"y": [[i, i + 1] for i in range(300)]})
        answer = upload(client, "two", other)
        assert answer.status_code == 413 and "KSWEEP_DATASET_QUOTA_BYTES" in answer.json()["detail"]
        assert registry(svc) == before
        assert upload(client, "two", other, owner="bob").status_code == 201  # bob's own quota
    svc.stop()
    low = make_service(KSWEEP_DATASET_VALIDATE_MEMORY_BYTES="150000000")
    with low.client() as client:
        before = registry(low)
        answer = upload(client, "three", parquet_bytes(GOOD), filename="three.parquet")
        assert answer.status_code == 422
        assert "KSWEEP_DATASET_VALIDATE_MEMORY_BYTES" in answer.json()["detail"]
        assert "three.parquet" in answer.json()["detail"]
        assert registry(low) == before
    low.stop()
    slow = make_service(KSWEEP_DATASET_VALIDATE_TIMEOUT_S="0.05")
    with slow.client() as client:
        before = registry(slow)
        answer = upload(client, "four", parquet_bytes(GOOD), filename="four.parquet")
        assert answer.status_code == 422, answer.text
        assert "KSWEEP_DATASET_VALIDATE_TIMEOUT_S" in answer.json()["detail"]
        assert "four.parquet" in answer.json()["detail"]
        assert registry(slow) == before


def test_api_process_never_loads_pyarrow() -> None:
    import subprocess
    import sys

    code = "import sys, service.api.app; print('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

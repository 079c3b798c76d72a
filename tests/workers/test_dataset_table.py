"""Dataset tables: reading each format, every hostile column, the content hash and the summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from workers.datasets.table import (
    BASE_NLL,
    LABEL,
    DatasetError,
    DatasetLimits,
    canonicalize,
    content_hash,
    read_table,
    summarize,
    tokenizer_of,
)

GOOD = {
    "y": [[1, 2], [3], [4, 5, 6], [7]],
    "x": [[], [1], [2, 2], []],
    "label": ["a", "b", "a", "b"],
    "split": ["train", "val", "test", "train"],
}


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _refused(table_or_path: pa.Table | Path, name: str = "data.parquet",
             limits: DatasetLimits | None = None) -> DatasetError:
    with pytest.raises(DatasetError) as info:
        if isinstance(table_or_path, Path):
            table = read_table(table_or_path, limits)
            canonicalize(table, table_or_path.name, limits)
        else:
            canonicalize(table_or_path, name, limits)
    return info.value


def test_canonical_types_and_missing_x() -> None:
    table = canonicalize(pa.table({"y": pa.array([[1], [2, 3]], pa.list_(pa.int16()))}), "f")
    assert table.column_names == ["y", "x"]
    assert table.schema.field("y").type == pa.list_(pa.int64())
    assert table.column("x").to_pylist() == [[], []]
    assert tokenizer_of(table) is None


def test_same_rows_same_hash_across_formats(tmp_path: Path) -> None:
    source = pa.table(GOOD)
    pq.write_table(source, tmp_path / "d.parquet", row_group_size=1)
    feather.write_feather(source, tmp_path / "d.arrow", compression="uncompressed")
    _write_jsonl(tmp_path / "d.jsonl", [json.dumps(dict(zip(GOOD, row, strict=True)))
                                        for row in zip(*GOOD.values(), strict=True)])
    hashes = {content_hash(canonicalize(read_table(tmp_path / f), f))
              for f in ("d.parquet", "d.arrow", "d.jsonl")}
    assert len(hashes) == 1
    other = dict(GOOD, y=[[1, 2], [3], [4, 5, 6], [8]])
    assert content_hash(canonicalize(pa.table(other), "f")) not in hashes
    # Row order matters.
    flipped = pa.table({k: list(reversed(v)) for k, v in GOOD.items()})
    assert content_hash(canonicalize(flipped, "f")) not in hashes


def test_summary_values() -> None:
    summary = summarize(canonicalize(pa.table(dict(GOOD, extra=[1, 2, 3, 4])), "f"))
    assert summary["rows"] == 4
    assert summary["rows_per_split"] == {"train": 2, "val": 1, "test": 1}
    assert summary["tokens"]["train"] == {"y": 3, "x": 0}
    assert summary["tokens"]["test"] == {"y": 3, "x": 2}
    assert summary["vocab_size"] == 8
    assert summary["labels"] == {"a": 2, "b": 2} and summary["label_classes"] == 2
    assert summary["y_length"]["p100"] == 3.0 and summary["y_length"]["p0"] == 1.0
    assert summary["ignored_columns"] == ["extra"]


def test_text_columns_are_byte_tokenized() -> None:
    table = canonicalize(pa.table({"x_text": ["", "ab"], "y_text": ["é", "z"]}), "f")
    assert table.column("y").to_pylist() == [[0xC3, 0xA9], [ord("z")]]
    assert table.column("x").to_pylist() == [[], [ord("a"), ord("b")]]
    assert tokenizer_of(table) == "bytes"
    err = _refused(pa.table({"y": [[1]], "y_text": ["a"]}))
    assert err.column == "y_text"


@pytest.mark.parametrize(("columns", "column", "row", "words"), [
    ({"x": [[1]]}, "y", None, "no `y` column"),
    ({"y": [[1], []]}, "y", 1, "empty"),
    ({"y": [[1], None]}, "y", 1, "missing"),
    ({"y": [[1], [2, -3]]}, "y", 1, "negative"),
    ({"y": [[1.0], [2.5]]}, "y", 1, "3.0 is not an id"),
    ({"y": [[True]]}, "y", 0, "bool"),
    ({"y": pa.array([[1], [2**63]], pa.list_(pa.uint64()))}, "y", 1, "beyond int64"),
    ({"y": [[1], [1]], "x": [[0], [-1]]}, "x", 1, "negative"),
    ({"y": [[1, 2], [3]], BASE_NLL: [[0.1, 0.2], [0.1, 0.2]]}, BASE_NLL, 1, "has 2 values"),
    ({"y": [[1], [3]], BASE_NLL: [[0.1], [float("nan")]]}, BASE_NLL, 1, "NaN or infinite"),
    ({"y": [[1], [3]], BASE_NLL: [[float("inf")], [0.1]]}, BASE_NLL, 0, "NaN or infinite"),
    ({"y": [[1], [3]], BASE_NLL: [[0.0], [-0.1]]}, BASE_NLL, 1, "negative"),
    ({"y": [[1], [3]], LABEL: [1.5, 2.0]}, LABEL, 0, "int or string"),
    ({"y": [[1], [3]], LABEL: ["a", None]}, LABEL, 1, "missing"),
    ({"y": [[1], [2], [3]], "split": ["train", "dev", "test"]}, "split", 1, "'dev'"),
    ({"y": [[1], [2]], "split": ["train", "val"]}, "split", None, "`test` empty"),
    ({"y": [[i] for i in range(10)], "group": [str(i) for i in range(10)]}, "group", 8,
     "10 distinct groups"),
])
def test_hostile_columns(columns: dict, column: str, row: int | None, words: str) -> None:
    err = _refused(pa.table(columns))
    assert (err.file, err.column, err.row) == ("data.parquet", column, row)
    assert words in err.message
    text = str(err)
    assert "data.parquet" in text and f"column {column!r}" in text and "Fix:" in text
    if row is not None:
        assert f"row {row}" in text


@pytest.mark.parametrize(("lines", "column", "row", "words"), [
    (['{"y": [1, 2]}', '{"y": [3.0]}'], "y", 1, "3.0 is not an id"),
    (['{"y": [1, 2]}', '{"y": [true]}'], "y", 1, "true"),
    (['{"y": [1]}', '{"y": [9223372036854775808]}'], "y", 1, "beyond int64"),
    (['{"y": [1]}', '{"y": [1' + "0" * 40 + "]}"], "y", 1, "beyond int64"),
    (['{"y": [1], "label": 1}', '{"y": [2], "label": "b"}'], "label", 1, "mixes types"),
    (['{"y": [1], "base_nll": [0.5]}', '{"y": [2], "base_nll": [NaN]}'], BASE_NLL, 1, "NaN"),
    (['{"y": [1]}', '{"x": [2]}'], "y", 1, "missing"),
    (['{"y": [1]}', '{"y": [2'], None, 1, "not valid JSON"),
])
def test_hostile_jsonl(tmp_path: Path, lines: list[str], column: str | None, row: int,
                       words: str) -> None:
    err = _refused(_write_jsonl(tmp_path / "rows.jsonl", lines))
    assert (err.file, err.column, err.row) == ("rows.jsonl", column, row)
    assert words in err.message


def test_jsonl_line_cap(tmp_path: Path) -> None:
    long = '{"y": [' + ", ".join(["7"] * 600) + "]}"
    err = _refused(_write_jsonl(tmp_path / "long.jsonl", ['{"y": [1]}', long]),
                   limits=DatasetLimits(max_line_bytes=1024))
    assert err.row == 1 and "over 1024 bytes" in err.message


def test_wrong_format_and_truncation(tmp_path: Path) -> None:
    pq.write_table(pa.table({"y": [[1, 2]] * 50}), tmp_path / "ok.parquet")
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "json.parquet").write_text('{"y": [1]}\n')
    (tmp_path / "pq.jsonl").write_bytes(data)
    (tmp_path / "pq.arrow").write_bytes(data)
    (tmp_path / "d.zip").write_bytes(b"PK\x03\x04")
    for name in ("cut.parquet", "json.parquet", "pq.jsonl", "pq.arrow", "d.zip"):
        err = _refused(tmp_path / name)
        assert err.file == name and err.column is None and "Fix:" in str(err)
    assert "truncated" in _refused(tmp_path / "cut.parquet").message


def test_parquet_caps_from_footer(tmp_path: Path) -> None:
    pq.write_table(pa.table({"y": [[7] * 1000] * 2000}), tmp_path / "bomb.parquet",
                   compression="zstd", use_dictionary=False)
    assert "compressed" in _refused(tmp_path / "bomb.parquet").message
    pq.write_table(pa.table({"y": [[1]] * 30}), tmp_path / "rows.parquet")
    err = _refused(tmp_path / "rows.parquet", limits=DatasetLimits(max_rows=20))
    assert "30 rows" in err.message and err.row == 20
    err = _refused(tmp_path / "rows.parquet", limits=DatasetLimits(max_tokens=10))
    assert "30 values" in err.message and err.column == "y"


def test_arrow_stream_and_file(tmp_path: Path) -> None:
    table = pa.table({"y": [[1], [2, 3]]})
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    feather.write_feather(table, tmp_path / "f.feather")
    for name in ("s.arrow", "f.feather"):
        assert read_table(tmp_path / name).column("y").to_pylist() == [[1], [2, 3]]


def test_list_length_and_token_caps() -> None:
    err = _refused(pa.table({"y": [[1], list(range(20))]}), limits=DatasetLimits(max_list_length=10))
    assert err.row == 1 and "20 entries" in err.message
    err = _refused(pa.table({"y": [[1] * 8] * 2}), limits=DatasetLimits(max_tokens=10))
    assert "16 tokens" in err.message


def test_large_table_hash_is_chunking_independent() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, 200_000)
    values = pa.array(rng.integers(0, 5000, int(lengths.sum())))
    y = pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lengths)], pa.int32()), values)
    group = pa.array(np.array(["a", "bb", "", "dddd"])[rng.integers(0, 4, len(lengths))])
    one = canonicalize(pa.table({"y": y, "group": group}), "f")
    chunked = pa.Table.from_batches(one.to_batches(max_chunksize=7_777))
    assert content_hash(one) == content_hash(chunked)
    part = one.slice(123, 1000)
    rebuilt = pa.Table.from_pylist(part.to_pylist(), schema=one.schema)
    assert content_hash(part) == content_hash(rebuilt)

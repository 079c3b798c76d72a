"""Read a dataset file (Parquet, Arrow IPC, JSONL) with pyarrow, capped before the data is read.

The format comes from the suffix (or the caller) and must match the file's magic bytes.
Parquet: rows, tokens (leaf value counts of ``x`` / ``y``) and the compression ratio are
checked from the footer before any page is read, then the file is memory-mapped. Arrow IPC
(file or stream): memory-mapped, batch by batch, rows and decoded bytes capped as they come.
JSONL: line lengths and the row count checked in one streaming pass, then pyarrow's JSON
reader; when it fails or infers a type that is not an id list, a line-by-line Python pass
finds the first offending row (``3.0`` and ``true`` are not ids, an int beyond int64 is refused).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from workers.datasets.formats import SUFFIX_FORMATS, Format
from workers.datasets.limits import DatasetError, DatasetLimits

PARQUET_MAGIC = b"PAR1"
ARROW_FILE_MAGIC = b"ARROW1"
ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"
ID_COLUMNS = ("x", "y")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def first_true(mask: pa.Array | pa.ChunkedArray) -> int | None:
    """Index of the first true entry of a boolean array (nulls count as false), or None."""
    if len(mask) == 0:
        return None
    idx = pc.index(pc.fill_null(mask, False), True).as_py()
    return None if idx is None or idx < 0 else int(idx)


def format_of(path: Path) -> Format:
    """The format a file's suffix names; refuses other suffixes (archives included)."""
    fmt = SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DatasetError(f"unknown file type {path.suffix!r}", file=path.name, column=None,
                           row=None, fix="give a .parquet, .arrow/.feather or .jsonl file "
                           "(no archives; compress inside Parquet instead)")
    return fmt


def _refuse_format(file: str, fmt: str, detail: str) -> DatasetError:
    return DatasetError(f"not a readable {fmt} file ({detail})", file=file, column=None,
                        row=None, fix=f"upload a complete {fmt} file, or name its real format")


def _check_magic(path: Path, fmt: Format, file: str) -> None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        f.seek(max(0, size - 6))
        tail = f.read(6)
    if fmt == "parquet" and not (head[:4] == PARQUET_MAGIC and tail[-4:] == PARQUET_MAGIC):
        raise _refuse_format(file, fmt, "no PAR1 magic at both ends: another format, or truncated")
    if fmt == "arrow" and not (
        (head[:6] == ARROW_FILE_MAGIC and tail == ARROW_FILE_MAGIC)
        or head[:4] == ARROW_STREAM_MAGIC
    ):
        raise _refuse_format(file, fmt, "no ARROW1 magic at both ends: another format, or truncated")
    if fmt == "jsonl" and head[:1] not in (b"{", b" ", b"\n", b"\r", b"\t"):
        raise _refuse_format(file, fmt, "its first line is not a JSON object")


def _read_parquet(path: Path, file: str, limits: DatasetLimits) -> pa.Table:
    try:
        pf = pq.ParquetFile(path, memory_map=True)
    except (pa.ArrowException, OSError) as exc:
        raise _refuse_format(file, "parquet", str(exc)[:200]) from exc
    md = pf.metadata
    if md.num_rows > limits.max_rows:
        raise DatasetError(f"{md.num_rows} rows (Parquet footer), over the limit of "
                           f"{limits.max_rows}", file=file, column=None, row=limits.max_rows,
                           fix="register fewer rows")
    tokens, decoded = 0, 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            decoded += col.total_uncompressed_size
            if col.path_in_schema.split(".")[0] in ID_COLUMNS:
                tokens += col.num_values
    if tokens > limits.max_tokens:
        raise DatasetError(f"{tokens} values in x and y (Parquet footer), over the limit of "
                           f"{limits.max_tokens}", file=file, column="y", row=None,
                           fix="register fewer or shorter examples")
    ratio = decoded / max(1, path.stat().st_size)
    if ratio > limits.max_compression_ratio:
        raise DatasetError(f"compressed {ratio:.0f}:1, beyond the limit of "
                           f"{limits.max_compression_ratio:.0f}:1", file=file, column=None,
                           row=None, fix="write the Parquet file with ordinary compression")
    try:
        return pf.read()
    except (pa.ArrowException, OSError) as exc:
        raise _refuse_format(file, "parquet", str(exc)[:200]) from exc


def _read_arrow(path: Path, file: str, limits: DatasetLimits) -> pa.Table:
    size = max(1, path.stat().st_size)
    try:
        source = pa.memory_map(str(path))
        with path.open("rb") as f:
            stream = f.read(4) == ARROW_STREAM_MAGIC
        reader = pa.ipc.open_stream(source) if stream else pa.ipc.open_file(source)
        batches = iter(reader) if stream else (reader.get_batch(i)
                                               for i in range(reader.num_record_batches))
        out, rows, decoded = [], 0, 0
        for batch in batches:
            rows += batch.num_rows
            decoded += batch.nbytes
            if rows > limits.max_rows:
                raise DatasetError(f"over {limits.max_rows} rows", file=file, column=None,
                                   row=limits.max_rows, fix="register fewer rows")
            if decoded / size > limits.max_compression_ratio:
                raise DatasetError(f"decodes to over {limits.max_compression_ratio:.0f}x its size",
                                   file=file, column=None, row=rows - batch.num_rows,
                                   fix="write the Arrow file uncompressed or lightly compressed")
            out.append(batch)
        return pa.Table.from_batches(out, schema=reader.schema)
    except (pa.ArrowException, OSError) as exc:
        raise _refuse_format(file, "arrow", str(exc)[:200]) from exc


def _scan_lines(path: Path, file: str, limits: DatasetLimits) -> int:
    rows = 0
    with path.open("rb") as f:
        while line := f.readline(limits.max_line_bytes + 1):
            if len(line) > limits.max_line_bytes:
                raise DatasetError(f"a line over {limits.max_line_bytes} bytes", file=file,
                                   column=None, row=rows, fix="shorten the example, or use Parquet")
            if line.strip():
                rows += 1
                if rows > limits.max_rows:
                    raise DatasetError(f"over {limits.max_rows} rows", file=file, column=None,
                                       row=limits.max_rows, fix="register fewer rows")
    return rows


FIXES = {
    "x": "store ids as integers in [0, 2**63)", "y": "store ids as integers in [0, 2**63)",
    "base_nll": "store b_t in nats as finite numbers >= 0",
    "label": "use one type for every label: all integers or all strings",
}


def _diagnose_value(key: str, value: Any, first_label_type: list[type]) -> str | None:
    """Why one JSON field of one row cannot be canonical, or None."""
    if key in ("x", "y", "base_nll"):
        if not isinstance(value, list):
            return f"`{key}` is {type(value).__name__}, not a list"
        for v in value:
            if isinstance(v, bool):
                return f"`{key}` holds {json.dumps(v)}: true/false are not ids or nats"
            if key == "base_nll":
                if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                    return f"`base_nll` holds {v!r}: b_t is a finite number >= 0"
            elif isinstance(v, float):
                return f"`{key}` holds {v!r}: ids are integers (3.0 is not an id)"
            elif not isinstance(v, int):
                return f"`{key}` holds {type(v).__name__} {v!r}: ids are integers"
            elif not INT64_MIN <= v <= INT64_MAX:
                return f"`{key}` holds {v}, beyond int64"
    elif key == "label":
        if not isinstance(value, int | str) or isinstance(value, bool):
            return f"`label` is {type(value).__name__}: labels are int or string"
        if not first_label_type:
            first_label_type.append(type(value))
        elif type(value) is not first_label_type[0]:
            return (f"`label` mixes types: {first_label_type[0].__name__} in an earlier row, "
                    f"{type(value).__name__} here")
    elif key in ("group", "split", "x_text", "y_text") and not isinstance(value, str):
        return f"`{key}` is {type(value).__name__}, not a string"
    return None


def _diagnose_jsonl(path: Path, file: str, detail: str) -> DatasetError:
    """Find the first offending row of a JSONL file pyarrow refused or mistyped."""
    label_type: list[type] = []
    with path.open("rb") as f:
        row = -1
        for raw in f:
            if not raw.strip():
                continue
            row += 1
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError) as exc:  # ValueError covers huge-int digits too
                return DatasetError(f"not valid JSON ({exc})", file=file, column=None, row=row,
                                    fix="write one JSON object per line")
            if not isinstance(obj, dict):
                return DatasetError("the line is not a JSON object", file=file, column=None,
                                    row=row, fix="write one JSON object per line")
            for key, value in obj.items():
                if value is None:
                    return DatasetError(f"`{key}` is null", file=file, column=key, row=row,
                                        fix=f"give every row a `{key}`, or drop the field")
                why = _diagnose_value(key, value, label_type)
                if why:
                    return DatasetError(why, file=file, column=key, row=row,
                                        fix=FIXES.get(key, f"store `{key}` as a string"))
    return DatasetError(f"pyarrow cannot read it ({detail})", file=file, column=None, row=None,
                        fix="write one JSON object per line with the documented columns")


def _typed_as_documented(name: str, t: pa.DataType) -> bool:
    """Whether pyarrow's inferred type for column ``name`` is one canonicalize accepts as is."""
    inner = t.value_type if pa.types.is_list(t) else None
    if name in ID_COLUMNS:
        return inner is not None and bool(pa.types.is_int64(inner) or pa.types.is_null(inner))
    if name == "base_nll":
        return inner is not None and bool(pa.types.is_floating(inner) or pa.types.is_integer(inner))
    if name == "label":
        return bool(pa.types.is_int64(t) or pa.types.is_string(t))
    if name in ("group", "split", "x_text", "y_text"):
        return bool(pa.types.is_string(t))
    return True


def _needs_diagnosis(schema: pa.Schema) -> bool:
    """True when pyarrow inferred a type the JSON text may hide the offending row of."""
    return not all(_typed_as_documented(f.name, f.type) for f in schema)


def _read_jsonl(path: Path, file: str, limits: DatasetLimits) -> pa.Table:
    if _scan_lines(path, file, limits) == 0:
        raise DatasetError("no rows", file=file, column=None, row=None,
                           fix="write one JSON object per line")
    block = max(1 << 20, limits.max_line_bytes + 1)
    try:
        table = pajson.read_json(path, read_options=pajson.ReadOptions(block_size=block))
    except (pa.ArrowException, OSError) as exc:
        raise _diagnose_jsonl(path, file, str(exc)[:200]) from exc
    if _needs_diagnosis(table.schema):
        err = _diagnose_jsonl(path, file, "unexpected types")
        if err.row is not None:
            raise err
    return table


def read_table(path: Path | str, limits: DatasetLimits | None = None, *,
               fmt: Format | None = None, source_name: str | None = None) -> pa.Table:
    """Read one dataset file into an Arrow table (memory-mapped where the format allows).

    Args:
        path: the file.
        limits: caps checked while reading (default :class:`DatasetLimits`).
        fmt: the format; default from the suffix (``.parquet``/``.pq``, ``.arrow``/``.feather``/
            ``.ipc``, ``.jsonl``/``.ndjson``). Either way it must match the magic bytes.
        source_name: the name errors cite (default the file's name; the service passes the
            uploaded name, not its temp file's).

    Raises:
        DatasetError: an unknown or mismatched format, a truncated file, a cap exceeded, or
            (JSONL) the first row pyarrow cannot type as the documented columns.
    """
    path = Path(path)
    limits = limits or DatasetLimits()
    file = source_name or path.name
    fmt = fmt or format_of(path)
    if path.stat().st_size == 0:
        raise _refuse_format(file, fmt, "the file is empty")
    _check_magic(path, fmt, file)
    readers = {"parquet": _read_parquet, "arrow": _read_arrow, "jsonl": _read_jsonl}
    return readers[fmt](path, file, limits)

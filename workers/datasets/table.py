"""A researcher's dataset as a table: validation, canonical form, content hash, summary.

One row per example: ``y`` (target ids, at least one: the positions S(x, y)), ``x`` (context
ids, may be empty or absent), and optionally ``label`` (the latent class, int64 or string),
``group`` (string, at most ``limits.max_groups`` values), ``base_nll`` (b_t in nats aligned
with ``y``, finite, >= 0) and ``split`` (train / val / test, each present); or text,
``x_text`` / ``y_text``, tokenized here (bytes by default). Every refusal is a
:class:`DatasetError` naming the file, column, first offending row (0-based) and fix. pyarrow
only, no torch; nothing in a dataset is executed or unpickled (pyarrow's own parsers only).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workers.contract import SPLITS
from workers.datasets.limits import DatasetError, DatasetLimits
from workers.datasets.read import first_true, read_table

__all__ = [
    "BASE_NLL", "GROUP", "LABEL", "SPLIT", "X", "X_TEXT", "Y", "Y_TEXT", "BytesTokenizer",
    "DatasetError", "DatasetLimits", "TextTokenizer", "canonicalize", "content_hash",
    "read_table", "summarize", "tokenizer_of",
]

Y = "y"
X = "x"
LABEL = "label"
GROUP = "group"
BASE_NLL = "base_nll"
SPLIT = "split"
X_TEXT = "x_text"
Y_TEXT = "y_text"
CANONICAL_COLUMNS: tuple[str, ...] = (Y, X, LABEL, GROUP, BASE_NLL, SPLIT)
ID_LIST = pa.list_(pa.int64())
NLL_LIST = pa.list_(pa.float32())
# Schema metadata of a canonical table (not hashed): the tokenizer and the dropped columns.
META_TOKENIZER = b"ksweep.tokenizer"
META_IGNORED = b"ksweep.ignored_columns"
HASH_VERSION = b"ksweep-dataset-v1"


class TextTokenizer(Protocol):
    """Turns ``x_text`` / ``y_text`` into ids at registration (``name`` goes in the record)."""

    name: str

    def encode(self, texts: pa.Array) -> pa.Array:
        """One list<int64> of ids per string of ``texts`` (a non-null string array)."""
        ...


class BytesTokenizer:
    """The built-in byte-level tokenizer: a string's ids are its UTF-8 bytes (0..255)."""

    name = "bytes"

    def encode(self, texts: pa.Array) -> pa.Array:
        """UTF-8 bytes as ids, without a copy of the text per row."""
        arr = texts.cast(pa.large_string()) if not pa.types.is_large_string(texts.type) else texts
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
        data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if arr.buffers()[2] else np.zeros(0, np.uint8)
        values = pa.array(data[offsets[0]: offsets[-1]].astype(np.int64))
        return pa.ListArray.from_arrays(pa.array(offsets - offsets[0], pa.int32()), values)


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _flat_row(lengths: np.ndarray, flat_index: int) -> int:
    """The row holding flat list element ``flat_index``."""
    return int(np.searchsorted(np.cumsum(lengths), flat_index, side="right"))


def _check_lists(col: pa.Array, name: str, file: str, limits: DatasetLimits,
                 what: str) -> tuple[pa.Array, np.ndarray]:
    """Refuse non-lists and null rows; return the flattened values and the row lengths."""
    if pa.types.is_null(col.type) and len(col):
        raise DatasetError(f"`{name}` is empty (null) in every row", file=file, column=name,
                           row=0, fix=f"store {what} per row")
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)
            or pa.types.is_fixed_size_list(col.type)):
        raise DatasetError(f"`{name}` has type {col.type}, not a list", file=file, column=name,
                           row=0 if len(col) else None, fix=f"store {what} per row")
    row = first_true(col.is_null())
    if row is not None:
        raise DatasetError(f"`{name}` is missing (null)", file=file, column=name, row=row,
                           fix=f"give every row {what} (an empty list is written [])")
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
    row = first_true(pa.array(lengths > limits.max_list_length))
    if row is not None:
        raise DatasetError(f"`{name}` has {lengths[row]} entries, over the limit of "
                           f"{limits.max_list_length}", file=file, column=name, row=row,
                           fix="shorten or split the example")
    flat = pc.list_flatten(col)
    idx = first_true(flat.is_null())
    if idx is not None:
        raise DatasetError(f"`{name}` holds a null entry", file=file, column=name,
                           row=_flat_row(lengths, idx), fix=f"store {what} without nulls")
    return flat, lengths


def _id_column(col: pa.Array, name: str, file: str, limits: DatasetLimits) -> pa.Array:
    """Validate one column of token id lists; return it as list<int64>."""
    what = "a list of integer token ids"
    flat, lengths = _check_lists(col, name, file, limits, what)
    t = flat.type
    if pa.types.is_null(t):  # only empty lists
        return pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lengths)], pa.int32()),
                                        pa.array([], pa.int64()))
    if pa.types.is_boolean(t) or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        fix = "store ids as integers (true/false are not ids)" if pa.types.is_boolean(t) \
            else "store ids as integers (int64)"
        raise DatasetError(f"`{name}` holds {t} values, not integer ids", file=file, column=name,
                           row=_flat_row(lengths, 0) if len(flat) else 0, fix=fix)
    if pa.types.is_floating(t):
        bad = pc.or_(pc.invert(pc.is_finite(flat)), pc.not_equal(pc.trunc(flat), flat))
        idx = first_true(bad)
        raise DatasetError(f"`{name}` holds floats ({t}); 3.0 is not an id", file=file,
                           column=name, row=_flat_row(lengths, idx if idx is not None else 0),
                           fix="store ids as integers (int64)")
    if pa.types.is_unsigned_integer(t):
        idx = first_true(pc.greater(flat, pa.scalar(2**63 - 1, t)))
        if idx is not None:
            raise DatasetError(f"`{name}` holds an id beyond int64", file=file, column=name,
                               row=_flat_row(lengths, idx), fix="ids must be in [0, 2**63)")
    else:
        idx = first_true(pc.less(flat, pa.scalar(0, t)))
        if idx is not None:
            raise DatasetError(f"`{name}` holds a negative id ({flat[idx].as_py()})", file=file,
                               column=name, row=_flat_row(lengths, idx),
                               fix="ids are >= 0 (remap your vocabulary to 0..V-1)")
    return pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lengths)], pa.int32()),
                                    flat.cast(pa.int64()))


def _nll_column(col: pa.Array, y_lengths: np.ndarray, file: str,
                limits: DatasetLimits) -> pa.Array:
    what = "a list of per-token base surprisals in nats, one per `y` token"
    flat, lengths = _check_lists(col, BASE_NLL, file, limits, what)
    row = first_true(pa.array(lengths != y_lengths))
    if row is not None:
        raise DatasetError(f"`base_nll` has {lengths[row]} values but `y` has {y_lengths[row]}",
                           file=file, column=BASE_NLL, row=row, fix="give one b_t per y token")
    if len(flat) and not (pa.types.is_floating(flat.type) or pa.types.is_integer(flat.type)):
        raise DatasetError(f"`base_nll` holds {flat.type} values", file=file, column=BASE_NLL,
                           row=_flat_row(lengths, 0), fix="store nats as float")
    values = flat.cast(pa.float32(), safe=False) if len(flat) else pa.array([], pa.float32())
    for bad, msg in ((pc.invert(pc.is_finite(values)), "a NaN or infinite value"),
                     (pc.less(values, 0), "a negative value")):
        idx = first_true(bad)
        if idx is not None:
            raise DatasetError(f"`base_nll` holds {msg} ({flat[idx].as_py()})", file=file,
                               column=BASE_NLL, row=_flat_row(lengths, idx),
                               fix="b_t = -log p(y_t | x, y_<t) is finite and >= 0 (float32)")
    return pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lengths)], pa.int32()), values)


def _string_column(col: pa.Array, name: str, file: str, fix: str) -> pa.Array:
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise DatasetError(f"`{name}` has type {col.type}, not string", file=file, column=name,
                           row=0 if len(col) else None, fix=fix)
    row = first_true(col.is_null())
    if row is not None:
        raise DatasetError(f"`{name}` is missing (null)", file=file, column=name, row=row, fix=fix)
    return col.cast(pa.string())


def _label_column(col: pa.Array, file: str) -> pa.Array:
    fix = "use one type for every label: all integers or all strings"
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_integer(col.type) and not pa.types.is_uint64(col.type):
        out = col.cast(pa.int64())
    elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        out = col.cast(pa.string())
    else:
        raise DatasetError(f"`label` has type {col.type}: labels are int or string", file=file,
                           column=LABEL, row=0 if len(col) else None, fix=fix)
    row = first_true(out.is_null())
    if row is not None:
        raise DatasetError("`label` is missing (null)", file=file, column=LABEL, row=row,
                           fix="give every row a label, or drop the column")
    return out


def _tokenize(table: pa.Table, file: str, tokenizer: TextTokenizer) -> pa.Table:
    for text, ids in ((X_TEXT, X), (Y_TEXT, Y)):
        if text not in table.column_names:
            continue
        if ids in table.column_names:
            raise DatasetError(f"both `{ids}` and `{text}` are given", file=file, column=text,
                               row=None, fix=f"keep ids (`{ids}`) or text (`{text}`), not both")
        col = _string_column(_column(table, text), text, file, f"store `{text}` as a string")
        table = table.append_column(ids, tokenizer.encode(col))
    return table.drop_columns([c for c in (X_TEXT, Y_TEXT) if c in table.column_names])


def canonicalize(table: pa.Table, source_name: str, limits: DatasetLimits | None = None, *,
                 tokenizer: TextTokenizer | None = None) -> pa.Table:
    """Validate every column and return the canonical table.

    Args:
        table: as read by :func:`read_table` (or built in memory).
        source_name: the file name errors cite.
        limits: the caps (rows, tokens, list lengths, groups); default :class:`DatasetLimits`.
        tokenizer: for ``x_text`` / ``y_text``; default :class:`BytesTokenizer`. Given for a
            table without text columns, it is refused (the ids would not be its).

    Returns:
        Columns in the order ``y, x[, label][, group][, base_nll][, split]`` with the types the
        module docstring gives. Unknown columns are dropped and listed in the schema metadata
        (``summarize`` reports them), as is the tokenizer's name when text was tokenized.

    Raises:
        DatasetError: the first problem found, naming file, column, first offending row and fix.
    """
    limits = limits or DatasetLimits()
    file = source_name
    if table.num_rows == 0:
        raise DatasetError("the table has no rows", file=file, column=None, row=None,
                           fix="register at least one example")
    if table.num_rows > limits.max_rows:
        raise DatasetError(f"{table.num_rows} rows, over the limit of {limits.max_rows}",
                           file=file, column=None, row=limits.max_rows, fix="register fewer rows")
    dupes = {c for c in table.column_names if table.column_names.count(c) > 1}
    if dupes:
        raise DatasetError("a column name appears twice", file=file, column=sorted(dupes)[0],
                           row=None, fix="give each column one name")
    tok_name = None
    if tokenizer is not None and X_TEXT not in table.column_names \
            and Y_TEXT not in table.column_names:
        raise DatasetError(f"a tokenizer ({tokenizer.name.partition('@')[0]}) was given, but the "
                           "table has no text to tokenize", file=file, column=Y_TEXT, row=None,
                           fix="give the text as `y_text` (and `x_text`), or register the ids "
                           "without a tokenizer")
    if X_TEXT in table.column_names or Y_TEXT in table.column_names:
        tokenizer = tokenizer or BytesTokenizer()
        tok_name = tokenizer.name
        table = _tokenize(table, file, tokenizer)
    if Y not in table.column_names:
        raise DatasetError("no `y` column", file=file, column=Y, row=None,
                           fix="add `y` (target token ids, a list of int per row) or `y_text`")
    y = _id_column(_column(table, Y), Y, file, limits)
    y_lengths = pc.list_value_length(y).to_numpy(zero_copy_only=False)
    row = first_true(pa.array(y_lengths == 0))
    if row is not None:
        raise DatasetError("`y` is empty", file=file, column=Y, row=row,
                           fix="every example needs at least one target token")
    if X in table.column_names:
        x = _id_column(_column(table, X), X, file, limits)
    else:
        x = pa.ListArray.from_arrays(pa.array(np.zeros(table.num_rows + 1), pa.int32()),
                                     pa.array([], pa.int64()))
    tokens = int(y_lengths.sum()) + len(x.values)
    if tokens > limits.max_tokens:
        raise DatasetError(f"{tokens} tokens in x and y, over the limit of {limits.max_tokens}",
                           file=file, column=Y, row=None, fix="register fewer or shorter examples")
    cols: dict[str, pa.Array] = {Y: y, X: x}
    if LABEL in table.column_names:
        cols[LABEL] = _label_column(_column(table, LABEL), file)
    if GROUP in table.column_names:
        group = _string_column(_column(table, GROUP), GROUP, file, "store groups as strings")
        uniq, first = np.unique(np.asarray(group.to_numpy(zero_copy_only=False), dtype=object),
                                return_index=True)
        if len(uniq) > limits.max_groups:
            raise DatasetError(f"{len(uniq)} distinct groups, over {limits.max_groups}", file=file,
                               column=GROUP, row=int(np.sort(first)[limits.max_groups]),
                               fix=f"merge groups into at most {limits.max_groups}")
        cols[GROUP] = group
    if BASE_NLL in table.column_names:
        cols[BASE_NLL] = _nll_column(_column(table, BASE_NLL), y_lengths, file, limits)
    if SPLIT in table.column_names:
        split = _string_column(_column(table, SPLIT), SPLIT, file,
                               "write train, val or test in every row")
        row = first_true(pc.invert(pc.is_in(split, pa.array(SPLITS))))
        if row is not None:
            raise DatasetError(f"split {split[row].as_py()!r} is not train, val or test", file=file,
                               column=SPLIT, row=row, fix="write train, val or test in every row")
        for name in SPLITS:
            if not pc.any(pc.equal(split, name)).as_py():
                raise DatasetError(f"the split column leaves `{name}` empty", file=file,
                                   column=SPLIT, row=None,
                                   fix=f"mark some rows `{name}`, or drop `split` and let the spec's "
                                   "split_fractions assign rows")
        cols[SPLIT] = split
    ignored = [c for c in table.column_names if c not in cols]
    meta = {META_IGNORED: json.dumps(ignored).encode()}
    if tok_name:
        meta[META_TOKENIZER] = tok_name.encode()
    return pa.table(cols).replace_schema_metadata(meta)


def tokenizer_of(table: pa.Table) -> str | None:
    """The tokenizer ``canonicalize`` applied to text columns, or None (ids were given)."""
    value = (table.schema.metadata or {}).get(META_TOKENIZER)
    return value.decode() if value else None


def _hash_array(h: Any, arr: pa.ChunkedArray | pa.Array, batch: int = 1 << 16) -> None:
    """Feed one canonical column, chunking-independently: lengths digest, then values digest."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    lengths, values = hashlib.sha256(), hashlib.sha256()
    for start in range(0, len(arr), batch):
        part = arr.slice(start, batch)
        if pa.types.is_list(part.type) or pa.types.is_string(part.type):
            n = (pc.list_value_length(part) if pa.types.is_list(part.type)
                 else pc.binary_length(part))
            lengths.update(n.to_numpy(zero_copy_only=False).astype("<i8").tobytes())
            flat = pc.list_flatten(part) if pa.types.is_list(part.type) else None
            if flat is None:
                offsets = np.frombuffer(part.buffers()[1], np.int32)[part.offset:][:len(part) + 1]
                data = part.buffers()[2]
                values.update(memoryview(data)[offsets[0]:offsets[-1]] if data else b"")
            else:
                dtype = "<f4" if pa.types.is_float32(flat.type) else "<i8"
                values.update(flat.to_numpy(zero_copy_only=False).astype(dtype).tobytes())
        else:
            values.update(part.to_numpy(zero_copy_only=False).astype("<i8").tobytes())
    h.update(lengths.digest() + values.digest())


def content_hash(table: pa.Table) -> str:
    """sha256 hex over the canonical columns in row order (not the file's bytes).

    Independent of chunking, row groups, schema metadata and the source format: the same
    rows give the same hash from Parquet, Arrow or JSONL.
    """
    h = hashlib.sha256(HASH_VERSION)
    h.update(str(table.num_rows).encode())
    for name in CANONICAL_COLUMNS:
        if name in table.column_names:
            t = table.schema.field(name).type
            tag = f"list<{t.value_type}>" if pa.types.is_list(t) else str(t)  # field names vary
            h.update(f"|{name}:{tag}|".encode())
            _hash_array(h, table.column(name))
    return h.hexdigest()


def _quantiles(lengths: np.ndarray) -> dict[str, float]:
    qs = (0.0, 0.5, 0.9, 0.99, 1.0)
    values = np.quantile(lengths, qs) if len(lengths) else np.zeros(len(qs))
    return {f"p{int(q * 100)}": float(v) for q, v in zip(qs, values, strict=True)}


def _counts(col: pa.ChunkedArray, limit: int = 100) -> dict[str, int]:
    counts = pc.value_counts(col.combine_chunks()).to_pylist()
    counts.sort(key=lambda d: (-d["counts"], str(d["values"])))
    return {str(d["values"]): int(d["counts"]) for d in counts[:limit]}


def summarize(table: pa.Table) -> dict[str, Any]:
    """What a researcher checks after registering: a JSON-ready dict.

    Keys: ``rows``, ``rows_per_split`` (``{"all": n}`` without a split column), ``tokens``
    (y and x totals, per split), ``vocab_size`` (max id + 1 over x and y), ``labels``
    (class -> size, the 100 largest; ``label_classes`` counts them all, None without labels),
    ``groups``, ``y_length`` / ``x_length`` quantiles, ``has_base_nll``, ``ignored_columns``.
    """
    y_len = pc.list_value_length(table.column(Y)).to_numpy().astype(np.int64)
    x_len = pc.list_value_length(table.column(X)).to_numpy().astype(np.int64)
    split = (np.asarray(table.column(SPLIT).to_numpy(zero_copy_only=False), dtype=object)
             if SPLIT in table.column_names else np.full(table.num_rows, "all", dtype=object))
    names = [s for s in (*SPLITS, "all") if (split == s).any()]
    maxes = [pc.max(pc.list_flatten(table.column(c))).as_py() for c in (Y, X)]
    meta = table.schema.metadata or {}
    out: dict[str, Any] = {
        "rows": table.num_rows,
        "rows_per_split": {s: int((split == s).sum()) for s in names},
        "tokens": {s: {"y": int(y_len[split == s].sum()), "x": int(x_len[split == s].sum())}
                   for s in names},
        "vocab_size": max((m for m in maxes if m is not None), default=-1) + 1,
        "label_classes": None, "labels": None, "groups": None,
        "y_length": _quantiles(y_len), "x_length": _quantiles(x_len),
        "has_base_nll": BASE_NLL in table.column_names,
        "ignored_columns": json.loads(meta.get(META_IGNORED, b"[]")),
    }
    if LABEL in table.column_names:
        out["labels"] = _counts(table.column(LABEL))
        out["label_classes"] = pc.count_distinct(table.column(LABEL)).as_py()
    if GROUP in table.column_names:
        out["groups"] = _counts(table.column(GROUP))
    return out

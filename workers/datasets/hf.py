"""A Hugging Face ``datasets`` folder (``save_to_disk``) converted to one Parquet file.

Read with pyarrow directly from the folder's Arrow files: never ``load_dataset``, never a loading
script, nothing imported from ``datasets``. Every file ``state.json`` (and ``dataset_dict.json``)
names must resolve inside the folder (symlinks followed), or the folder is refused. A
``DatasetDict`` folder becomes one table with a ``split`` column from its split names
(``train``, ``validation``/``val``/``valid`` -> ``val``, ``test``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from workers.datasets.limits import DatasetError, DatasetLimits
from workers.datasets.read import ARROW_STREAM_MAGIC

HF_STATE_FILE = "state.json"
HF_DICT_FILE = "dataset_dict.json"
SPLIT_NAMES = {"train": "train", "validation": "val", "val": "val", "valid": "val",
               "test": "test"}
MAX_JSON_BYTES = 1 << 20


def is_saved_folder(path: Path) -> bool:
    """True for a folder ``save_to_disk`` wrote (a Dataset or a DatasetDict)."""
    return path.is_dir() and ((path / HF_STATE_FILE).is_file() or (path / HF_DICT_FILE).is_file())


def _inside(root: Path, relative: Any, what: str) -> Path:
    """``root / relative`` if it is a plain relative path resolving inside ``root``."""
    if not isinstance(relative, str) or not relative:
        raise DatasetError(f"{what} names {relative!r}, not a file name", file=root.name,
                           column=None, row=None, fix="save the dataset again with save_to_disk")
    target = (root / relative).resolve()
    if not target.is_relative_to(root.resolve()):
        raise DatasetError(f"{what} names {relative!r}, which resolves outside the folder",
                           file=root.name, column=None, row=None,
                           fix="only files inside the saved folder are read; save it again")
    return target


def _json(path: Path, top: Path) -> Any:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise DatasetError(f"{path.name} is over {MAX_JSON_BYTES} bytes", file=top.name,
                           column=None, row=None, fix="save the dataset again with save_to_disk")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise DatasetError(f"{path.name} is not JSON ({exc})", file=top.name, column=None,
                           row=None, fix="save the dataset again with save_to_disk") from exc


def _read_part(part: Path, top: Path, limits: DatasetLimits) -> pa.Table:
    state = _json(_inside(top, str(part.relative_to(top) / HF_STATE_FILE), HF_STATE_FILE), top)
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not files:
        raise DatasetError("state.json lists no _data_files", file=top.name, column=None,
                           row=None, fix="save the dataset again with save_to_disk")
    tables, rows = [], 0
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        path = _inside(top, str(part.relative_to(top) / name) if isinstance(name, str) else name,
                       "state.json")
        with path.open("rb") as handle:
            stream = handle.read(4) == ARROW_STREAM_MAGIC
        try:
            source = pa.memory_map(str(path))
            reader = pa.ipc.open_stream(source) if stream else pa.ipc.open_file(source)
            table = reader.read_all()
        except (pa.ArrowException, OSError) as exc:
            raise DatasetError(f"{path.name} is not a readable Arrow file ({str(exc)[:200]})",
                               file=top.name, column=None, row=None,
                               fix="save the dataset again with save_to_disk") from exc
        rows += table.num_rows
        if rows > limits.max_rows:
            raise DatasetError(f"over {limits.max_rows} rows", file=top.name, column=None,
                               row=limits.max_rows, fix="register fewer rows")
        tables.append(table.replace_schema_metadata(None))
    return pa.concat_tables(tables)


def read_saved_folder(folder: Path | str, limits: DatasetLimits | None = None) -> pa.Table:
    """The rows of a ``save_to_disk`` folder as one table (a ``split`` column for a DatasetDict).

    Raises:
        DatasetError: not such a folder, a path escaping it, an unknown split name, a
            ``split`` column clashing with the DatasetDict's splits, unreadable Arrow files.
    """
    top = Path(folder).resolve()
    limits = limits or DatasetLimits()
    if (top / HF_STATE_FILE).is_file():
        return _read_part(top, top, limits)
    if not (top / HF_DICT_FILE).is_file():
        raise DatasetError("not a save_to_disk folder (no state.json or dataset_dict.json)",
                           file=top.name, column=None, row=None,
                           fix="give a Parquet, Arrow or JSONL file, or a save_to_disk folder")
    splits = _json(top / HF_DICT_FILE, top).get("splits")
    if not isinstance(splits, list) or not splits:
        raise DatasetError("dataset_dict.json lists no splits", file=top.name, column=None,
                           row=None, fix="save the DatasetDict again with save_to_disk")
    parts = []
    for split in splits:
        if split not in SPLIT_NAMES:
            raise DatasetError(f"split {split!r} is not train, validation or test", file=top.name,
                               column="split", row=None,
                               fix="rename the DatasetDict's splits to train/validation/test")
        table = _read_part(_inside(top, split, HF_DICT_FILE), top, limits)
        if "split" in table.column_names:
            raise DatasetError("the DatasetDict's rows already have a `split` column",
                               file=top.name, column="split", row=None,
                               fix="drop the column or save a single Dataset")
        parts.append(table.append_column("split", pa.array([SPLIT_NAMES[split]] * table.num_rows,
                                                           pa.string())))
    try:
        return pa.concat_tables(parts)
    except pa.ArrowInvalid as exc:
        raise DatasetError(f"the splits have different columns ({str(exc)[:200]})", file=top.name,
                           column=None, row=None, fix="give every split the same features") from exc


def convert_saved_folder(folder: Path | str, target: Path, limits: DatasetLimits | None = None) -> Path:
    """Write the folder's rows to ``target`` as zstd Parquet (what ``ksweep data add`` uploads)."""
    pq.write_table(read_saved_folder(folder, limits), target, compression="zstd")
    return target

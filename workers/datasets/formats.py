"""The dataset file formats: one table of each format's suffixes and media types.

Pure Python, so the API process picks a format from a Content-Type and the CLI from a suffix
without pyarrow. Archives and compressed files are not formats (compress inside Parquet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["BY_NAME", "FORMATS", "MEDIA_FORMATS", "SUFFIX_FORMATS", "FileFormat", "Format"]

Format = Literal["parquet", "arrow", "jsonl"]


@dataclass(frozen=True)
class FileFormat:
    """One format: the suffixes that name it and the media types an upload may declare it by.

    The first suffix is the one a file of this format is written with, the first media type the
    one the CLI sends.
    """

    name: Format
    suffixes: tuple[str, ...]
    media_types: tuple[str, ...]


FORMATS: tuple[FileFormat, ...] = (
    FileFormat("parquet", (".parquet", ".pq"),
               ("application/vnd.apache.parquet", "application/x-parquet", "application/parquet")),
    FileFormat("arrow", (".arrow", ".feather", ".ipc"),
               ("application/vnd.apache.arrow.file", "application/vnd.apache.arrow.stream",
                "application/x-arrow")),
    FileFormat("jsonl", (".jsonl", ".ndjson"),
               ("application/x-ndjson", "application/jsonl", "application/jsonlines",
                "application/x-jsonlines")),
)
BY_NAME: dict[str, FileFormat] = {f.name: f for f in FORMATS}
SUFFIX_FORMATS: dict[str, Format] = {s: f.name for f in FORMATS for s in f.suffixes}
MEDIA_FORMATS: dict[str, Format] = {m: f.name for f in FORMATS for m in f.media_types}

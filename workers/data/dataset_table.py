"""The dataset table's earlier path, kept for code that imports it: :mod:`workers.datasets.table`
(and :func:`~workers.datasets.read.read_table`, which it has always handed on)."""

from workers.datasets.limits import DatasetError
from workers.datasets.read import read_table
from workers.datasets.table import (
    BytesTokenizer,
    TextTokenizer,
    canonicalize,
    content_hash,
    summarize,
    tokenizer_of,
)

__all__ = ["BytesTokenizer", "DatasetError", "TextTokenizer", "canonicalize", "content_hash",
           "read_table", "summarize", "tokenizer_of"]

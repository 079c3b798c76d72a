"""Interim stand-in for developer `data`'s module (column names only); replaced at merge."""

Y = "y"
X = "x"
LABEL = "label"
GROUP = "group"
BASE_NLL = "base_nll"
SPLIT = "split"


class DatasetError(ValueError):
    """A dataset problem naming the file, column, first offending row and the fix."""

    def __init__(self, message: str, *, file: str | None = None, column: str | None = None,
                 row: int | None = None, fix: str | None = None) -> None:
        self.file, self.column, self.row, self.fix = file, column, row, fix
        where = ", ".join(f"{k} {v}" for k, v in (("file", file), ("column", column), ("row", row))
                          if v is not None)
        super().__init__(f"{where}: {message}" + (f"; {fix}" if fix else ""))


def canonicalize(table, source_name, limits=None):
    """Stand-in: returns the table (the real one validates and canonicalizes)."""
    return table


def content_hash(table) -> str:
    """Stand-in: sha256 over the table's IPC bytes."""
    import hashlib

    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()

"""The error every dataset refusal raises, and the caps a registered dataset must fit.

The lowest layer of the dataset modules (``read``, ``table``,
``store`` import it); pydantic only, so the API process can refuse without pyarrow.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# The validation child (workers.datasets.check): one thread per pool and the system
# allocator, so its address-space cap measures the data, not thread stacks and allocator arenas
# reserved up front; and its exit codes. Here, so the API can start it without importing it.
CHILD_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "OMP_NUM_THREADS": "1",
             "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
             "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
EXIT_REFUSED = 2
EXIT_OUT_OF_MEMORY = 3


class DatasetError(ValueError):
    """A dataset refused: names the file, the column, the first offending row and the fix.

    Attributes:
        file: the source file's name (or the dataset name for a bad name).
        column: the offending column, or None when the problem is the file itself.
        row: the first offending row, 0-based, or None when no single row is at fault.
        fix: what to change.
    """

    def __init__(self, message: str, *, file: str | None, column: str | None, row: int | None,
                 fix: str) -> None:
        self.message = message
        self.file = file
        self.column = column
        self.row = row
        self.fix = fix
        where = ", ".join(p for p in (
            f"file {file!r}" if file is not None else "",
            f"column {column!r}" if column is not None else "",
            f"row {row}" if row is not None else "",
        ) if p)
        super().__init__(f"{where}: {message}. Fix: {fix}" if where else f"{message}. Fix: {fix}")

    def to_dict(self) -> dict[str, object]:
        """The fields of a 422 problem document."""
        return {"file": self.file, "column": self.column, "row": self.row,
                "message": self.message, "fix": self.fix}


class DatasetLimits(BaseModel):
    """Caps checked before (from file metadata) and while a dataset is read.

    The defaults fit a 1,000,000-row dataset of short sequences; the service takes its own from
    the ``KSWEEP_MAX_DATASET_*`` settings.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_rows: int = Field(2_000_000, ge=1, description="Examples per dataset.")
    max_tokens: int = Field(200_000_000, ge=1, description="Ids in x plus y over all rows.")
    max_list_length: int = Field(65_536, ge=1, description="Ids in one row's x, y or base_nll.")
    max_groups: int = Field(8, ge=1, description="Distinct values of `group`.")
    max_line_bytes: int = Field(8 << 20, ge=1024, description="Bytes in one JSONL line.")
    max_compression_ratio: float = Field(
        50.0, gt=1, description="Decoded bytes per file byte (Parquet metadata, Arrow batches)."
    )

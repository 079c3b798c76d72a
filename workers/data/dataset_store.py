"""The dataset store's earlier path, kept for code that imports it: :mod:`workers.datasets.store`."""

from workers.datasets.store import (
    DatasetConflict,
    DatasetNotFound,
    DatasetQuotaExceeded,
    DatasetRecord,
    DatasetStore,
    StagedDataset,
)

__all__ = ["DatasetConflict", "DatasetNotFound", "DatasetQuotaExceeded", "DatasetRecord",
           "DatasetStore", "StagedDataset"]

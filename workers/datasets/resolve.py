"""Resolve a spec's dataset name to its content hash, once per sweep (torch-free).

The caller owns the store's root (``KSWEEP_DATA_ROOT`` for the CLI, the service's settings
for its driver) and passes it down: nothing in ``sweeps/`` or ``workers/`` reads a setting.
The resolved :class:`DatasetDataConfig` carries ``sha256`` and ``root``, so every trial of
a sweep reads the same content even if the name is replaced while the sweep runs.
"""

from __future__ import annotations

from pathlib import Path

from workers.data.config import DatasetDataConfig
from workers.datasets.store import DatasetNotFound, DatasetStore


class DatasetResolutionError(ValueError):
    """A spec's dataset cannot be used; ``field`` is the spec path the message names."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def resolve_dataset(config: DatasetDataConfig, root: Path | str | None,
                    field: str = "template.data") -> DatasetDataConfig:
    """The config with ``sha256`` (the name's current hash, or the pin, checked) and ``root`` set.

    Raises:
        DatasetResolutionError: no store root was given; no dataset has that name (naming
            ``{field}.dataset``); the pinned hash differs from the name's (naming both).
    """
    if root is None:
        raise DatasetResolutionError(
            f"{field}.dataset", f"dataset {config.dataset!r} needs a dataset store; set "
            "KSWEEP_DATA_ROOT (default $KSWEEP_SWEEP_ROOT/datasets)")
    store = DatasetStore(Path(root))
    try:
        record = store.get(config.dataset)
    except DatasetNotFound:
        raise DatasetResolutionError(
            f"{field}.dataset", f"no dataset named {config.dataset!r} in the store at {root}; "
            f"register it with `ksweep data add FILE --name {config.dataset}` (`ksweep data "
            "list` shows what is there)") from None
    if config.sha256 is not None and config.sha256 != record.sha256:
        raise DatasetResolutionError(
            f"{field}.sha256", f"pinned {config.sha256} but dataset {config.dataset!r} holds "
            f"{record.sha256}; pin the new hash, or register the pinned content under another name")
    return config.model_copy(update={"sha256": record.sha256, "root": str(Path(root).resolve())})


def dataset_columns(config: DatasetDataConfig) -> list[str]:
    """The columns of a resolved dataset (its record's ``columns``)."""
    return list(DatasetStore(Path(str(config.root))).get(config.dataset).columns)

"""A trial's train split as the planner sees it before anything runs: its rows and its mean
number of active target tokens, or why they are not known yet.

The rows give the run's optimizer steps (epochs x ceil(rows / batch_size)); the mean length
gives beta in ELBO units under the per-example KL. The synthetic task's come from its
config (every target has prefix_length + L active tokens, L uniform on [body_length_min,
body_length_max], so its mean is P + (min + max) / 2 in expectation). A registered dataset's
come from its registry summary (a ``split`` column: exact, from the per-split row and token
counts), or, with a seeded split, from its table's target lengths and the same split rule the
trainer applies (:func:`fraction_assignment`) when the caller may read the table. Torch-free;
numpy and pyarrow are imported only to split or read a table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.data.config import DatasetDataConfig, SyntheticTaskConfig
from workers.datasets.store import DatasetNotFound, DatasetStore

if TYPE_CHECKING:  # numpy and pyarrow load where a table is split or read: the API imports this
    import numpy as np

__all__ = ["TrainFacts", "dataset_facts", "fraction_assignment", "synthetic_facts", "train_facts"]


@dataclass(frozen=True)
class TrainFacts:
    """The train split before a trial runs.

    Attributes:
        rows: train examples (None: not known).
        mean_target_length: mean active target tokens per train example (None: not known).
        source: where the numbers come from, or why they are not known (a sentence part).
    """

    rows: int | None
    mean_target_length: float | None
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fraction_assignment(n: int, config: DatasetDataConfig) -> np.ndarray:
    """``[n]`` int8 split index (0 train, 1 val, 2 test) of a table without a split column:
    train gets ``round(f_train n)`` rows, val ``round(f_val n)``, test the rest, in the order
    of a permutation seeded by ``split_seed``."""
    import numpy as np

    n_train = _fraction_train_rows(n, config)
    n_val = min(n - n_train, round(config.split_fractions.val * n))
    order = np.random.default_rng(config.split_seed).permutation(n)
    assignment = np.empty(n, dtype=np.int8)
    assignment[order[:n_train]] = 0
    assignment[order[n_train:n_train + n_val]] = 1
    assignment[order[n_train + n_val:]] = 2
    return assignment


def _fraction_train_rows(n: int, config: DatasetDataConfig) -> int:
    return round(config.split_fractions.train * n)


def synthetic_facts(config: SyntheticTaskConfig) -> TrainFacts:
    """The synthetic task's train rows and its expected mean target length."""
    mean = config.prefix_length + (config.body_length_min + config.body_length_max) / 2
    return TrainFacts(config.train_size, mean, "the synthetic task's config; the length is "
                      "expected: prefix_length + the mean body length")


def _truncated(config: DatasetDataConfig, summary: dict[str, Any]) -> bool:
    """Whether ``truncation: head`` cuts some targets (their lengths differ from the summary's)."""
    longest = float((summary.get("y_length") or {}).get("p100", 0))
    return (config.truncation == "head" and config.max_target_length is not None
            and config.max_target_length < longest)


def dataset_facts(config: DatasetDataConfig, root: Path | str | None,
                  read_table: bool = True) -> TrainFacts:
    """A registered dataset's train rows and mean target length (module doc); each None with
    the reason when the store or the dataset cannot be read, or (``read_table`` False) when
    only the table holds the number."""
    name, root = config.dataset, config.root or root
    if root is None:
        return TrainFacts(None, None, f"dataset {name!r} is not read here (no dataset store given)")
    store = DatasetStore(Path(root))
    try:
        record = store.get(name)
    except DatasetNotFound:
        return TrainFacts(None, None, f"dataset {name!r} is not registered in {root}")
    summary = record.summary
    per_split = summary.get("rows_per_split") or {}
    has_split, truncated = "train" in per_split, _truncated(config, summary)
    if has_split and not truncated:
        rows = int(per_split["train"])
        return TrainFacts(rows, int(summary["tokens"]["train"]["y"]) / rows,
                          f"dataset {name!r}'s split column (registry summary)")
    rows = int(per_split["train"]) if has_split else _fraction_train_rows(record.rows, config)
    if not read_table:
        why = ("max_target_length cuts some targets" if truncated
               else "its seeded split's target lengths are in the table")
        return TrainFacts(rows, None, f"dataset {name!r}: {why}, read when the trial runs "
                          "(`ksweep validate` reads it)")
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from workers.datasets.table import SPLIT, Y

    try:
        table = pq.read_table(store.data_path(config.sha256 or record.sha256),
                              columns=[Y, SPLIT] if has_split else [Y], memory_map=True)
    except (OSError, DatasetNotFound) as error:
        return TrainFacts(rows, None, f"dataset {name!r}'s table is not readable ({error})")
    lengths = pc.list_value_length(table.column(Y)).to_numpy(zero_copy_only=False).astype(np.int64)
    if truncated:
        lengths = np.minimum(lengths, config.max_target_length)
    train = (np.asarray(table.column(SPLIT).to_numpy(zero_copy_only=False), dtype=object) == "train"
             if has_split else fraction_assignment(len(lengths), config) == 0)
    return TrainFacts(int(train.sum()), float(lengths[train].mean()),
                      f"dataset {name!r}'s table (the train split's target lengths)")


def train_facts(data: SyntheticTaskConfig | DatasetDataConfig, root: Path | str | None = None,
                read_table: bool = True) -> TrainFacts:
    """:func:`synthetic_facts` or :func:`dataset_facts` for a trial's data."""
    if isinstance(data, DatasetDataConfig):
        return dataset_facts(data, root, read_table)
    return synthetic_facts(data)

"""A registered dataset's hash is checked once per process before a trial trains on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.datasets import register, strategy_table
from workers.data.config import DatasetDataConfig
from workers.datasets.limits import DatasetError
from workers.datasets.resolve import resolve_dataset
from workers.datasets.source import load_task
from workers.datasets.store import DatasetStore
from workers.datasets.table import canonicalize, content_hash
from workers.datasets.verify import forget_verified, verify_once

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_process_memory():
    forget_verified()
    yield
    forget_verified()


def _registered(tmp_path: Path) -> DatasetDataConfig:
    register(tmp_path / "datasets", strategy_table(120, split=False), "toy")
    return resolve_dataset(DatasetDataConfig(dataset="toy"), tmp_path / "datasets")


def _tamper(data: DatasetDataConfig) -> str:
    """Overwrite the stored object with other rows (as a damaged or edited copy); their hash."""
    path = DatasetStore(str(data.root)).data_path(str(data.sha256))
    other = canonicalize(strategy_table(90, split=False), "other.parquet")
    os.chmod(path, 0o644)
    pq.write_table(other, path)
    return content_hash(other)


def test_a_process_verifies_a_dataset_once(tmp_path):
    data = _registered(tmp_path)
    assert verify_once(data) > 0.0
    assert verify_once(data) == 0.0  # remembered for the process's life
    forget_verified()
    assert verify_once(data) > 0.0


def test_a_changed_stored_copy_stops_the_trial_naming_the_dataset_and_both_hashes(tmp_path):
    data = _registered(tmp_path)
    load_task(data, tmp_path / "cache")  # builds and caches the arrays: a later trial skips the table
    actual = _tamper(data)
    assert actual != data.sha256
    load_task(data, tmp_path / "cache")  # same process, already verified: not re-hashed
    forget_verified()  # a new worker process
    for _ in range(2):  # a refusal is not remembered: every try checks again
        with pytest.raises(DatasetError) as caught:
            load_task(data, tmp_path / "cache")
        message = str(caught.value)
        assert "'toy'" in message and actual in message and str(data.sha256) in message
        assert caught.value.file == str(DatasetStore(str(data.root)).data_path(str(data.sha256)))
        assert "--replace" in caught.value.fix
    with pytest.raises(DatasetError, match=actual):
        load_task(data)  # without a cache as well


def test_a_new_worker_process_refuses_a_changed_copy(tmp_path):
    data = _registered(tmp_path)
    actual = _tamper(data)
    code = ("import sys; from workers.data.config import DatasetDataConfig; "
            "from workers.datasets.source import load_task; "
            "load_task(DatasetDataConfig.model_validate_json(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, data.model_dump_json()], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1
    assert "DatasetError" in done.stderr and actual in done.stderr and str(data.sha256) in done.stderr

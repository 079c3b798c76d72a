"""Trials on a registered dataset: tensors, splits, truncation, base kinds, label-less elbo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from tests.support.datasets import register, strategy_table
from tests.support.mlflow_store import sqlite_store_uri
from workers.data.config import BOS_ID, CONTENT_START, PAD_ID, DatasetDataConfig
from workers.datasets.resolve import DatasetResolutionError, resolve_dataset
from workers.datasets.source import build_task, load_task
from workers.datasets.table import DatasetError
from workers.models.config import BaseModelConfig
from workers.readouts.evaluate import collect
from workers.train import Trainer, TrialConfig
from workers.zfree.dataset import dataset_base

ROOT = Path(__file__).resolve().parents[2]
LEARNED = BaseModelConfig(kind="learned", epochs=2, hidden_dim=16, embedding_dim=8)


def _resolved(tmp_path: Path, table: pa.Table, name: str = "toy", **data) -> DatasetDataConfig:
    register(tmp_path / "datasets", table, name)
    return resolve_dataset(DatasetDataConfig(dataset=name, **data), tmp_path / "datasets")


def _trial(data: DatasetDataConfig, base: str = "learned", **overrides) -> TrialConfig:
    return TrialConfig.model_validate({
        "data": data.model_dump(), "base": {**LEARNED.model_dump(), "kind": base},
        "model": {"hidden_dim": 16, "embedding_dim": 8},
        "training": {"epochs": 1, "batch_size": 32}, "readouts": {"gradient_batch": 16},
        **overrides})


def test_tensors_compact_ids_above_the_reserved_ones_and_keep_every_row(tmp_path):
    table = strategy_table(120, split=False)
    task = build_task(table, DatasetDataConfig(dataset="t", sha256="0" * 64, root="/"))
    used = np.unique(np.concatenate([np.concatenate(table.column("y").to_pylist()),
                                     np.concatenate([x for x in table.column("x").to_pylist() if x])]))
    assert task.vocab_size == CONTENT_START + used.size < 100  # ids start at 50_000
    assert task.original_ids.tolist() == used.tolist()
    assert sum(task.rows.values()) == 120 and task.rows == {"train": 96, "val": 12, "test": 12}
    train = task.splits["train"]
    lengths = train.mask.sum(1)
    assert int(train.target[train.mask].min()) >= CONTENT_START
    assert (train.target[~train.mask] == PAD_ID).all()
    assert (train.context[:, -1] == BOS_ID).all()  # x left-padded, BOS last
    # Compact ids map back to the original ids, row by row, in order.
    originals = {tuple(y) for y in table.column("y").to_pylist()}
    for row in range(5):
        ids = train.target[row, : int(lengths[row])] - CONTENT_START
        assert tuple(task.original_ids[ids.numpy()].tolist()) in originals
    assert task.label_classes == ["class0", "class1", "class2"]
    assert task.groups == ("long", "short")
    assert set(train.kind.tolist()) <= {0, 1} and set(train.strategy.tolist()) <= {0, 1, 2}


def test_split_column_is_used_and_an_empty_split_is_refused_by_name():
    config = DatasetDataConfig(dataset="t", sha256="0" * 64, root="/")
    task = build_task(strategy_table(40, split=True), config)
    assert task.rows == {"train": 20, "val": 10, "test": 10}
    empty = config.model_copy(update={"split_fractions": {"train": 0.9, "val": 0.0, "test": 0.1}})
    with pytest.raises(DatasetError, match=r"split 'val' is empty.*split_fractions\.val"):
        build_task(strategy_table(40), DatasetDataConfig.model_validate(
            {**config.model_dump(), "split_fractions": empty.split_fractions}))
    with pytest.raises(ValidationError, match="split_fractions must sum to 1"):
        DatasetDataConfig(dataset="t", split_fractions={"train": 0.5, "val": 0.1, "test": 0.1})
    with pytest.raises(ValidationError, match="dataset"):
        DatasetDataConfig(dataset="../etc/passwd")


def test_truncation_is_refused_by_default_and_head_is_counted():
    table = strategy_table(80, base_nll=True, max_len=9)
    lengths = np.array([len(y) for y in table.column("y").to_pylist()])
    first_long = int(np.flatnonzero(lengths > 5)[0])
    config = DatasetDataConfig(dataset="t", sha256="0" * 64, root="/", max_target_length=5)
    with pytest.raises(DatasetError) as error:
        build_task(table, config)
    assert error.value.row == first_long and error.value.column == "y"
    assert "truncation: head" in str(error.value)
    task = build_task(table, config.model_copy(update={"truncation": "head"}))
    assert task.truncated_rows == int((lengths > 5).sum()) > 0
    assert task.max_target_length == 5
    for name, split in task.splits.items():  # base_nll cut alike: zero off the kept mask
        assert split.mask.sum(1).max() <= 5
        assert task.base_nll[name].shape == split.target.shape


def test_learned_base_never_sees_a_val_or_test_row(tmp_path):
    table = strategy_table(160, split=True)
    splits = table.column("split").to_pylist()
    ys = table.column("y").to_pylist()
    rng = np.random.default_rng(1)
    # The same train rows; every val/test target replaced by other tokens of the same ids.
    changed = [y if s == "train" else rng.permutation(ys[(i + 1) % len(ys)]).tolist()[:len(y)]
               for i, (y, s) in enumerate(zip(ys, splits, strict=True))]
    other = table.set_column(table.column_names.index("y"), "y",
                             pa.array(changed, type=pa.list_(pa.int64())))
    first = load_task(_resolved(tmp_path, table, "a"))
    second = load_task(_resolved(tmp_path, other, "b"))
    assert first.config.sha256 != second.config.sha256 and first.vocab_size == second.vocab_size
    base_a, _ = dataset_base(first, LEARNED, tmp_path)
    base_b, _ = dataset_base(second, LEARNED, tmp_path)
    assert base_a.cache_path != base_b.cache_path and not base_b.cache_hit
    weights_a = torch.load(base_a.cache_path / "model.pt")
    weights_b = torch.load(base_b.cache_path / "model.pt")
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)  # bit-identical
    assert base_a.c_base == base_b.c_base
    meta = json.loads((base_a.cache_path / "meta.json").read_text())
    assert meta["train_rows"] == first.rows["train"] == 80
    assert meta["dataset_sha256"] == first.config.sha256 and meta["split_hash"] == first.split_hash
    again, _ = dataset_base(first, LEARNED, tmp_path)  # cached by (hash, split, base)
    assert again.cache_hit and again.cache_path == base_a.cache_path


def test_precomputed_base_reads_the_column_and_oracle_is_refused(tmp_path):
    table = strategy_table(100, base_nll=True)
    task = load_task(_resolved(tmp_path, table))
    base, test_nll = dataset_base(task, BaseModelConfig(kind="precomputed"), tmp_path)
    train = task.splits["train"]
    assert base.kind == "precomputed"
    assert torch.equal(base.train_nll[train.mask], task.base_nll["train"][train.mask])
    per_example = (base.train_nll * train.mask).sum(1) / train.mask.sum(1)
    assert base.c_base == pytest.approx(float(per_example.double().mean()), rel=1e-6)
    assert test_nll.shape == task.splits["test"].target.shape
    with pytest.raises(ValueError, match=r"base.kind: 'oracle'.*dataset 'toy'"):
        dataset_base(task, BaseModelConfig(kind="oracle"), tmp_path)
    bare = load_task(_resolved(tmp_path, strategy_table(100), "bare"))
    with pytest.raises(ValueError, match="base.kind: 'precomputed' reads the base_nll column"):
        dataset_base(bare, BaseModelConfig(kind="precomputed"), tmp_path)


def test_label_less_trial_logs_elbo_and_no_latent_recovery(tmp_path):
    data = _resolved(tmp_path, strategy_table(120, label=False, base_nll=True))
    trainer = Trainer.create(_trial(data, base="precomputed"), tmp_path)
    metrics = trainer.run_epoch()
    assert not any("latent_nmi" in k or "latent_ari" in k or "mi_zs" in k for k in metrics)
    assert not any("pi_explained_share" in k or "grad_share_explained" in k for k in metrics)
    assert "val/grad_share_top_decile_b" in metrics and "val/long/elbo" in metrics
    # elbo = mean over examples of sum_t l_t + KL, recomputed from the model's outputs.
    data_val = trainer.val_data
    trainer.model.eval()
    collected = collect(lambda idx: trainer._forward(data_val, idx)[0], len(data_val.split), 64,
                        trainer.device)
    expected = ((collected.token_nll.double() * data_val.split.mask).sum(1)
                + collected.kl_per_example.double()).mean()
    assert metrics["val/elbo"] == pytest.approx(float(expected), rel=1e-5)
    assert metrics["val/elbo"] > metrics["val/recon_uniform"] > 0


def test_resolution_refuses_a_missing_name_and_a_differing_pin(tmp_path):
    record = register(tmp_path / "datasets", strategy_table(40), "toy")
    with pytest.raises(DatasetResolutionError, match=r"template.data.dataset: no dataset named 'nope'"):
        resolve_dataset(DatasetDataConfig(dataset="nope"), tmp_path / "datasets")
    pin = "f" * 64
    with pytest.raises(DatasetResolutionError) as error:
        resolve_dataset(DatasetDataConfig(dataset="toy", sha256=pin), tmp_path / "datasets")
    assert error.value.field == "template.data.sha256"
    assert pin in str(error.value) and record.sha256 in str(error.value)
    with pytest.raises(ValueError, match="was not resolved"):
        load_task(DatasetDataConfig(dataset="toy"))


@pytest.mark.slow
def test_ksweep_train_on_a_dataset_records_it_as_an_mlflow_input(tmp_path):
    record = register(tmp_path / "data", strategy_table(120), "toy")
    config = {"data": {"dataset": "toy"}, "base": {"kind": "learned", "epochs": 1},
              "training": {"epochs": 1}, "readouts": {"gradient_batch": 8}}
    path = tmp_path / "trial.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "MLFLOW_TRACKING_URI": sqlite_store_uri(tmp_path),
           "KSWEEP_SWEEP_ROOT": str(tmp_path / "root"), "KSWEEP_DATA_ROOT": str(tmp_path / "data"),
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "ksweep.cli", "train", str(path)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    run = client.search_runs([client.get_experiment_by_name("ksweep-trials").experiment_id])[0]
    assert run.data.params["dataset_sha256"] == record.sha256
    (entry,) = run.inputs.dataset_inputs
    assert (entry.dataset.name, entry.dataset.digest) == ("toy", record.sha256[:32])
    assert 0 <= run.data.metrics["val/latent_nmi"] <= 1 and run.data.metrics["val/elbo"] > 0
    path.write_text(yaml.safe_dump({**config, "data": {"dataset": "missing"}}))
    refused = subprocess.run([sys.executable, "-m", "ksweep.cli", "train", str(path)], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "data.dataset: no dataset named 'missing'" in refused.stdout


def test_the_trainer_arrays_are_cached_and_memory_mapped(tmp_path):
    from workers.datasets.cache import task_cache_key

    data = _resolved(tmp_path, strategy_table(120, base_nll=True))
    built = load_task(data)
    first = load_task(data, tmp_path)
    entry = tmp_path / "dataset_tensors" / task_cache_key(data)
    assert (entry / "meta.json").exists() and (entry / "target.npy").exists()
    again = load_task(data, tmp_path)
    for task in (first, again):
        assert task.vocab_size == built.vocab_size and task.rows == built.rows
        assert task.split_hash == built.split_hash and task.groups == built.groups
        for name, split in built.splits.items():
            assert torch.equal(task.splits[name].target, split.target)
            assert torch.equal(task.splits[name].context, split.context)
            assert torch.equal(task.base_nll[name], built.base_nll[name])
    other = data.model_copy(update={"split_seed": 1})
    assert task_cache_key(other) != task_cache_key(data)
    assert load_task(other, tmp_path).split_hash != built.split_hash


def test_free_bits_at_log_k_of_the_label_count_is_refused(tmp_path):
    data = _resolved(tmp_path, strategy_table(60))  # 3 label classes: log K = 1.0986
    config = _trial(data, loss_stack={"preset": "uniform", "terms": {
        "kl": {"weight": 1.0, "options": {"free_bits": 1.2}}}})
    with pytest.raises(ValueError, match=r"free_bits \(1.2\) must be below log K = 1.099"):
        Trainer.create(config, tmp_path)


def test_a_label_sorted_tables_train_readout_sees_every_class(tmp_path):
    """On a table sorted by label, the train read-outs' rows (``readouts.train_subset``) hold every
    class, in the lone trainer and a cohort alike, so a constant latent reads train NMI 0 and
    shuffled-label NMI 0 there (its first rows, one class, would read 1.0 and 1.0)."""
    from workers.cohort.evaluation import member_outputs
    from workers.cohort.trainer import Cohort
    from workers.readouts.evaluate import Collected
    from workers.readouts.split_data import readout_split

    table = strategy_table(240, base_nll=True)
    data = _resolved(tmp_path, table.sort_by("label"))
    config = _trial(data, base="precomputed", readouts={"gradient_batch": 0, "train_subset": 40})
    trainer = Trainer.create(config, tmp_path)
    train = trainer.train_data.split.strategy
    assert len(set(train[:40].tolist())) == 1 and len(set(train.tolist())) == 3  # sorted by label
    rows = readout_split(trainer.train_data, "train", 40)
    assert len(rows.split) == 40 and set(rows.split.strategy.tolist()) == {0, 1, 2}
    n = len(rows.split)
    constant = Collected(token_nll=torch.ones(n, rows.split.target.shape[1]), kl=torch.zeros(n),
                         bow_logits=torch.zeros(n, 4), posterior_probs=torch.full((n, 3), 1 / 3),
                         posterior_mean=None, posterior_logvar=None)
    values = trainer.evaluate_split("train", constant)
    assert values["train/latent_nmi"] == 0.0 and values["train/latent_nmi_shuffled"] == 0.0
    assert values["train/mutual_info"] == 0.0 and values["train/active_units"] == 0.0
    # A cohort's batched epoch end reads the same rows (two members on the same data).
    seeds = [config.model_copy(update={"seed": seed}) for seed in (0, 1)]
    cohort = Cohort.create(seeds, tmp_path / "cohort")
    members = [member.trainer for member in cohort.active]
    outputs = member_outputs(cohort.params, cohort.model_config, cohort.num_categories, members, {})
    for member, out in zip(members, outputs, strict=True):
        assert out["train"].token_nll.shape[0] == 40
        lone = readout_split(member.train_data, "train", 40).split.strategy
        assert torch.equal(lone, rows.split.strategy)

"""``base: {kind: causal_lm, model: NAME}`` in a dataset trial, on a tiny config-built Llama."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.tiny_lm import build_tiny_llama, text_table
from workers.data.config import DatasetDataConfig
from workers.datasets.resolve import DatasetResolutionError, resolve_dataset
from workers.datasets.source import load_task
from workers.datasets.store import DatasetStore
from workers.datasets.table import canonicalize, tokenizer_of
from workers.lm.loading import fingerprint_files, load_model
from workers.lm.registry import ModelError, ModelStore
from workers.lm.surprisal import token_surprisal
from workers.lm.tokenizer import ModelTextTokenizer
from workers.models.config import BaseModelConfig
from workers.train import Trainer, TrialConfig
from workers.zfree.dataset import dataset_base
from workers.zfree.resolve import resolve_model


@pytest.fixture
def setup(tmp_path: Path):
    folder = build_tiny_llama(tmp_path / "tiny")
    models = ModelStore(tmp_path / "models")
    record = models.add(folder, name="tiny", fingerprint=fingerprint_files)
    tok = ModelTextTokenizer.of(models, record)
    table = canonicalize(text_table(90), "toy.parquet", tokenizer=tok)
    datasets = DatasetStore(tmp_path / "datasets")
    datasets.add(table, name="toy", owner="t", tokenizer=tokenizer_of(table))
    as_bytes = canonicalize(text_table(90), "toy.parquet")
    datasets.add(as_bytes, name="toy-bytes", owner="t", tokenizer=tokenizer_of(as_bytes))
    data = resolve_dataset(DatasetDataConfig(dataset="toy", max_target_length=6,
                                             truncation="head"), tmp_path / "datasets")
    base = resolve_model(BaseModelConfig(kind="causal_lm", model="tiny"), tmp_path / "models",
                         dataset_name="toy", dataset_tokenizer=tokenizer_of(table))
    return folder, record, table, data, base


def test_causal_lm_base_lays_out_b_t_per_split_like_an_unbatched_model(setup, tmp_path) -> None:
    folder, record, table, data, base = setup
    assert base.model_sha256 == record.sha256 and base.model_root == str(tmp_path / "models")
    task = load_task(data)
    surprisal, test_nll = dataset_base(task, base, tmp_path / "cache")
    assert surprisal.kind == "causal_lm" and not surprisal.cache_hit
    # Independent: the whole table one row at a time, cut like y (head, 6 tokens).
    model = load_model(folder)
    xs, ys = table.column("x").to_pylist(), table.column("y").to_pylist()
    rows = token_surprisal(model, xs, ys, bos_id=1, max_batch_tokens=1, progress=False)
    by_split = {name: [r[:6] for r, s in zip(rows, _assignment(task, table), strict=True) if s == name]
                for name in ("train", "val", "test")}
    for name, got in (("train", surprisal.train_nll), ("val", surprisal.val_nll), ("test", test_nll)):
        mask = task.splits[name].mask
        assert got.shape == mask.shape and torch.all(got[~mask] == 0)
        expected = np.concatenate(by_split[name])
        np.testing.assert_allclose(got[mask].numpy(), expected, rtol=1e-5, atol=1e-6)
    c_base = np.mean([r.mean(dtype=np.float64) for r in by_split["train"]])
    assert surprisal.c_base == pytest.approx(c_base, rel=1e-5)
    again, _ = dataset_base(task, base, tmp_path / "cache")
    assert again.cache_hit and torch.equal(again.train_nll, surprisal.train_nll)
    # One real epoch of a trial on it.
    trial = TrialConfig.model_validate({
        "data": data.model_dump(), "base": base.model_dump(),
        "model": {"hidden_dim": 16, "embedding_dim": 8},
        "training": {"epochs": 1, "batch_size": 32}, "readouts": {"gradient_batch": 16}})
    metrics = Trainer.create(trial, tmp_path / "cache").run_epoch()
    assert np.isfinite(metrics["val/loss"]) and 0 <= metrics["val/latent_nmi"] <= 1


def _assignment(task, table) -> list[str]:
    from workers.datasets.source import split_assignment

    return [("train", "val", "test")[i] for i in split_assignment(table, task.config)]


def test_resolution_refuses_other_tokenizers_missing_models_and_pins(setup, tmp_path) -> None:
    _, record, _, _, _ = setup
    lm = BaseModelConfig(kind="causal_lm", model="tiny")
    with pytest.raises(DatasetResolutionError) as error:
        resolve_model(lm, tmp_path / "models", dataset_name="toy-bytes", dataset_tokenizer="bytes")
    assert error.value.field == "template.base.model"
    assert "'toy-bytes' was tokenized by tokenizer 'bytes'" in str(error.value)
    assert record.tokenizer_sha256 in str(error.value)
    with pytest.raises(DatasetResolutionError, match=r"template.base.model: model 'nope' is not"):
        resolve_model(BaseModelConfig(kind="causal_lm", model="nope"), tmp_path / "models",
                      dataset_name="toy", dataset_tokenizer=None)
    pinned = lm.model_copy(update={"model_sha256": "e" * 64})
    with pytest.raises(DatasetResolutionError, match=r"template.base.model_sha256: pinned e+"):
        resolve_model(pinned, tmp_path / "models", dataset_name="toy", dataset_tokenizer=None)
    with pytest.raises(ModelError, match="was not resolved"):
        dataset_base(load_task(setup[3]), lm, tmp_path / "cache")
    with pytest.raises(ValueError, match="causal_lm' needs base.model"):
        BaseModelConfig(kind="causal_lm")
    with pytest.raises(ValueError, match="read by base.kind 'causal_lm' only"):
        BaseModelConfig(kind="learned", model="tiny")

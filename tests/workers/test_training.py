"""The training recipe end to end: learning, metrics, divergence, resume, base cache, MLflow."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from objectives import token_weight_stats
from workers.data import SyntheticTaskConfig, generate_split, oracle_base_nll
from workers.train import Trainer, TrialConfig, TrialDiverged, load_trial_config
from workers.zfree.base import BaseModelConfig, load_or_train_base

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "workers" / "examples"
DESIGN_METRICS = [
    f"{split}/{name}"
    for split in ("train", "val")
    for name in ("loss", "recon_uniform", "recon_token_weighted", "recon_ncc", "kl", "kappa_mean",
                 "kappa_p50", "kappa_p90", "kappa_max", "cv2_mean")
] + ["val/latent_nmi", "val/latent_ari", "val/mutual_info", "val/active_units"]


def small(config: TrialConfig, **training) -> TrialConfig:
    data = config.data.model_copy(update={"train_size": 256, "val_size": 64, "test_size": 64})
    return config.model_copy(update={
        "data": data, "training": config.training.model_copy(update=training)
    })


@pytest.fixture(scope="module")
def discrete_example() -> TrialConfig:
    return load_trial_config(EXAMPLES / "discrete.yaml")


def test_examples_load_and_differ_in_family():
    configs = {path.stem: load_trial_config(path) for path in sorted(EXAMPLES.glob("*.yaml"))}
    assert set(configs) == {"discrete", "continuous", "mixed"}
    assert configs["mixed"].data.mixed and configs["mixed"].training.patience
    assert configs["discrete"].model.family == "discrete"
    assert configs["continuous"].model.family == "continuous"


@pytest.mark.parametrize(("example", "threshold"), [("discrete", 0.9), ("continuous", 0.9)])
def test_cvae_recovers_the_strategy(example, threshold, tmp_path):
    """The scientific read-out works: on the easy example config z recovers s."""
    config = load_trial_config(EXAMPLES / f"{example}.yaml")
    trainer = Trainer.create(config, tmp_path)
    trainer.run()
    nmi = trainer.history["val/latent_nmi"]
    assert len(nmi) == config.training.epochs
    assert nmi[-1] >= threshold, f"{example}: val/latent_nmi curve {nmi}"
    # log 2 = 0.69 is the maximum; free bits below log K keep q from being fully one-hot.
    assert trainer.history["val/mutual_info"][-1] > 0.25
    assert trainer.history["val/mi_zs"][-1] > 0.25


def test_epoch_metrics_have_the_design_names(discrete_example, tmp_path):
    trainer = Trainer.create(small(discrete_example, epochs=2), tmp_path)
    trainer.run()
    for name in DESIGN_METRICS:
        assert name in trainer.history, name
        assert len(trainer.history[name]) == 2
        assert all(v == v for v in trainer.history[name]), f"{name} has NaN"
    # kappa depends on b and alpha only; at alpha = 1 it is 1 + CV(b)^2 per example.
    assert trainer.history["val/kappa_mean"][0] > 1.5
    # The latent's use, every epoch on every split: the rate, I(x; z) and the (discrete) units.
    for split in ("train", "val", "test"):
        for name in ("kl", "mutual_info", "active_units", "used_categories"):
            values = trainer.history[f"{split}/{name}"]
            assert len(values) == 2 and all(v >= 0 for v in values), (split, name)
        assert all(0 <= v <= trainer.view.num_strategies
                   for v in trainer.history[f"{split}/active_units"])
    assert trainer.history["val/kappa_p50"][0] <= trainer.history["val/kappa_p90"][0]
    assert trainer.history["val/kappa_p90"][0] <= trainer.history["val/kappa_max"][0]
    assert trainer.history["val/cv2_mean"][0] == pytest.approx(trainer.history["val/kappa_mean"][0] - 1)
    assert max(trainer.history["val/baseline_self_check"]) < 1e-5


def test_test_read_once_at_the_selected_checkpoint_equals_the_per_epoch_read(discrete_example, tmp_path):
    config = small(discrete_example, epochs=3)
    every = Trainer.create(config, tmp_path)
    every.run()
    once_config = config.model_copy(update={"readouts": config.readouts.model_copy(update={"test_every_epoch": False})})
    once = Trainer.create(once_config, tmp_path)
    once.run()
    assert not any(key.startswith("test/") for key in once.history)
    tested = {key: value for key, value in once.final_metrics.items() if key.startswith("selected/test/")}
    assert "selected/test/latent_nmi" in tested and "selected/test/loss" in tested
    for key, value in tested.items():
        assert value == pytest.approx(every.final_metrics[key], rel=1e-9, abs=1e-12, nan_ok=True), key
    assert once.final_metrics["selected/epoch"] == every.final_metrics["selected/epoch"]


def test_nan_loss_stops_with_step_and_terms(discrete_example, tmp_path):
    trainer = Trainer.create(small(discrete_example, epochs=2, inject_nan_at_step=5), tmp_path)
    with pytest.raises(TrialDiverged, match=r"at step 5 \(epoch 2\).*token_weighted=") as info:
        trainer.run()
    assert "normalized_concentration_corrected" in str(info.value)
    assert trainer.epoch == 1  # the first epoch (steps 0-3) completed; the second did not


def test_checkpoint_resume_matches_an_uninterrupted_run(discrete_example, tmp_path):
    config = small(discrete_example, epochs=4)
    straight = Trainer.create(config, tmp_path)
    straight.run()
    first = Trainer.create(config, tmp_path)
    first.run_epoch()
    first.run_epoch()
    path = first.save_checkpoint(tmp_path / "ckpt" / "state.pt")
    resumed = Trainer.create(config, tmp_path)
    resumed.load_checkpoint(path)
    assert resumed.epoch == 2
    resumed.run()
    for key in ("train/loss", "val/loss", "val/latent_nmi"):
        assert resumed.history[key] == pytest.approx(straight.history[key], rel=1e-6), key
    other = Trainer.create(config.model_copy(update={"seed": 1}), tmp_path)
    with pytest.raises(ValueError, match="different trial config"):
        other.load_checkpoint(path)


def test_learned_base_model_is_cached_and_reused(tmp_path):
    data = SyntheticTaskConfig(train_size=128, val_size=32)
    base = BaseModelConfig(kind="learned", epochs=1)
    first = load_or_train_base(data, base, tmp_path)
    assert not first.cache_hit
    weights = first.cache_path / "model.pt"
    stamp = weights.stat().st_mtime_ns
    second = load_or_train_base(data, base, tmp_path)
    assert second.cache_hit, "the second trial must not retrain the base model"
    assert weights.stat().st_mtime_ns == stamp
    assert torch.equal(first.train_nll, second.train_nll)
    assert second.c_base == first.c_base
    meta = json.loads((first.cache_path / "meta.json").read_text())
    assert meta["c_base"] == pytest.approx(first.c_base)
    # c_base is the mean over train examples of b_u.
    split = generate_split(data, "train")
    b_u = first.train_nll.sum(-1) / split.mask.sum(-1)
    assert first.c_base == pytest.approx(float(b_u.double().mean()), rel=1e-6)
    changed = load_or_train_base(data, base.model_copy(update={"seed": 1}), tmp_path)
    assert not changed.cache_hit and changed.cache_path != first.cache_path


def test_oracle_kappa_concentrates_on_the_prefix():
    config = SyntheticTaskConfig(prefix_length=3, num_strategies=8, prefix_tokens_per_strategy=8,
                                 noise_rate=0.02, train_size=512, val_size=8)
    split = generate_split(config, "train")
    stats = token_weight_stats(oracle_base_nll(config, split), split.mask, 1.0)
    assert float(stats.kappa.mean()) > 2.0
    prefix_share = stats.weights[:, : config.prefix_length].sum(-1)
    assert float(prefix_share.mean()) > 0.8


def test_ksweep_train_logs_a_complete_mlflow_run(tmp_path):
    config = load_trial_config(EXAMPLES / "continuous.yaml")
    config = small(config, epochs=3)
    path = tmp_path / "trial.json"
    path.write_text(config.model_dump_json())
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "KSWEEP_SWEEP_ROOT": str(tmp_path / "root")}
    result = subprocess.run(
        [sys.executable, "-m", "ksweep.cli", "train", str(path), "--experiment", "t"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("t")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["alpha"] == "1.0" and params["model"] == "continuous" and params["seed"] == "0"
    assert params["loss_stack"] == "raw_plus_ncc+kl"
    assert float(params["c_base"]) > 0
    assert params["data.num_strategies"] == "2"
    # The run's units: 3 epochs x ceil(256 / 64) optimizer steps, beta in ELBO units beside them.
    assert params["total_steps"] == "12" and float(params["train_target_length"]) > 0
    assert float(params["elbo_beta"]) > 0
    assert "12 optimizer steps; mean target length" in result.stdout
    for name in DESIGN_METRICS:
        history = client.get_metric_history(run.info.run_id, name)
        assert [m.step for m in history] == [1, 2, 3], name
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test/latent_nmi")] == [1, 2, 3]
    metrics = run.data.metrics
    assert 1 <= metrics["selected/epoch"] <= 3
    selected = int(metrics["selected/epoch"])
    nmi = [m.value for m in client.get_metric_history(run.info.run_id, "test/latent_nmi")]
    assert metrics["selected/test/latent_nmi"] == pytest.approx(nmi[selected - 1])
    assert metrics["training/stop_epoch"] == 3
    assert 0 <= metrics["val/nmi_auc"] <= 1 and metrics["test/epochs_to_nmi90_censored"] in (0, 1)
    assert len(params["provenance.git_commit"]) in (40, 7) and params["provenance.git_dirty"] in (
        "true", "false")
    assert params["provenance.torch"] == torch.__version__.split("+")[0] or params["provenance.torch"]
    assert params["data.resolved_seed"] == "0" and len(params["data.hash.test"]) == 16
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/kappa_histogram_train.png", "plots/kappa_histogram_val.png",
            "plots/kappa_histogram_test.png", "plots/reconstruction_curves.png",
            "plots/position_profiles_val.png"} <= artifacts
    assert "val/latent_nmi" in result.stdout


def test_ksweep_train_rejects_a_bad_config_naming_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("training:\n  epochs: 0\nmodel:\n  famly: discrete\n")
    result = subprocess.run(
        [sys.executable, "-m", "ksweep.cli", "train", str(path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "training.epochs" in result.stdout and "model.famly" in result.stdout

"""The training protocol: seeds vary the data, early stopping on val loss, the checkpoint val
chose, a test split nothing selects on, and the free-bits rule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from workers.data import KindProportions, generate_split
from workers.train import Trainer, TrialConfig, load_trial_config

EXAMPLES = Path(__file__).resolve().parents[2] / "workers" / "examples"


def _config(**training) -> TrialConfig:
    config = load_trial_config(EXAMPLES / "discrete.yaml")
    data = config.data.model_copy(update={
        "train_size": 192, "val_size": 64, "test_size": 64, "seed": None,
        "kind_proportions": KindProportions(prefix=1.0, diffuse=1.0, private=1.0)})
    return config.model_copy(update={
        "data": data, "training": config.training.model_copy(update=training),
        "readouts": config.readouts.model_copy(update={"train_subset": 64, "gradient_batch": 32}),
    })


def test_trial_seed_draws_the_data_unless_it_is_pinned() -> None:
    def test_hash(config: TrialConfig) -> str:
        return generate_split(config.resolved_data(), "test").data_hash()

    base = _config()
    one, two = (base.model_copy(update={"seed": seed}) for seed in (1, 2))
    assert one.resolved_data().seed == 1 and two.resolved_data().seed == 2
    assert test_hash(one) != test_hash(two)
    pinned = base.data.model_copy(update={"seed": 7})
    assert test_hash(one.model_copy(update={"data": pinned})) == test_hash(
        two.model_copy(update={"data": pinned}))


def test_free_bits_at_or_above_log_k_is_rejected_naming_the_field() -> None:
    raw = {"model": {"family": "discrete"}, "data": {"num_strategies": 2},
           "loss_stack": {"preset": "uniform", "terms": {"kl": {"weight": 1.0,
                                                               "options": {"free_bits": 0.7}}}}}
    with pytest.raises(ValidationError, match=r"loss_stack\.terms\.kl\.options\.free_bits"):
        TrialConfig.model_validate(raw)
    assert TrialConfig.model_validate({**raw, "allow_free_bits_above_log_k": True})
    assert TrialConfig.model_validate({**raw, "data": {"num_strategies": 3}})  # 0.7 < log 3
    # The continuous family is not bound by the discrete latent's capacity.
    assert TrialConfig.model_validate({**raw, "model": {"family": "continuous"}})
    for path in EXAMPLES.glob("*.yaml"):
        load_trial_config(path)


def test_max_epochs_is_an_alias_of_epochs() -> None:
    assert TrialConfig.model_validate({"training": {"max_epochs": 7}}).training.epochs == 7


def test_early_stopping_stops_at_patience_and_restores_the_selected_checkpoint(tmp_path) -> None:
    # With min_delta huge only epoch 1 ever improves: stop at epoch max(min_epochs, 1 + patience).
    trainer = Trainer.create(_config(epochs=10, patience=2, min_epochs=4, min_delta=1e9), tmp_path)
    trainer.run()
    assert trainer.epoch == 4 and trainer.selection.best_epoch == 1
    final = trainer.final_metrics
    assert final["selected/epoch"] == 1 and final["training/stop_epoch"] == 4
    assert final["selected/val/loss"] == trainer.history["val/loss"][0]
    assert final["selected/test/latent_nmi"] == trainer.history["test/latent_nmi"][0]
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, trainer.selection.best_model[name]), name
    # The NMI curves are padded with their last value up to the horizon (10 epochs).
    curve = trainer.history["val/latent_nmi"]
    assert final["val/nmi_auc"] == pytest.approx((sum(curve) + 6 * curve[-1]) / 10)


def test_corrupting_the_test_split_changes_no_selection(tmp_path) -> None:
    config = _config(epochs=6, patience=1, min_epochs=2)
    clean = Trainer.create(config, tmp_path)
    clean.run()
    corrupt = Trainer.create(config, tmp_path)
    test = corrupt.test_data
    generator = torch.Generator().manual_seed(99)
    n = len(test.split)
    test.split = test.split.replace(
        strategy=torch.randint(0, config.data.num_strategies, (n,), generator=generator),
        kind=test.split.kind[torch.randperm(n, generator=generator)],
    )
    test.cond_nll = torch.rand(test.cond_nll.shape, generator=generator) * test.split.mask
    corrupt.run()
    assert corrupt.epoch == clean.epoch
    assert corrupt.selection.best_epoch == clean.selection.best_epoch
    assert corrupt.final_metrics["selected/epoch"] == clean.final_metrics["selected/epoch"]
    for name, values in clean.history.items():
        if name.startswith("val/"):
            assert corrupt.history[name] == values, name  # exactly, not approximately
    assert corrupt.history["test/latent_nmi"] != clean.history["test/latent_nmi"]


def test_every_kind_and_split_is_read_out(tmp_path) -> None:
    trainer = Trainer.create(_config(epochs=1), tmp_path)
    metrics = trainer.run_epoch()
    for split in ("train", "val", "test"):
        for kind in ("prefix", "diffuse", "private"):
            for name in ("kappa_p90", "inv_kappa_p10", "recon_cc", "recon_ncc", "latent_nmi",
                         "mi_zs", "kl", "pi_explained_share", "b_u"):
                key = f"{split}/{kind}/{name}"
                assert key in metrics and math.isfinite(metrics[key]), key
    # private examples: the prefix is unexplained, so less of pi sits on explained surprisal.
    assert metrics["val/private/pi_explained_share"] < metrics["val/prefix/pi_explained_share"]
    for group in ("prefix", "top_decile_b", "explained", "kind_prefix", "kind_diffuse", "kind_private"):
        assert math.isfinite(metrics[f"val/grad_share_{group}"]), group
    kinds = sum(metrics[f"val/grad_share_kind_{k}"] for k in ("prefix", "diffuse", "private"))
    assert kinds == pytest.approx(1.0)


def test_rank_correlation_is_undefined_at_alpha_zero(tmp_path) -> None:
    config = _config(epochs=1)
    config = config.model_copy(update={"loss_stack": config.loss_stack.model_copy(update={"alpha": 0.0})})
    metrics = Trainer.create(config, tmp_path).run_epoch()
    assert math.isnan(metrics["val/kl_kappa_spearman"])
    assert math.isnan(metrics["val/prefix/kl_kappa_spearman"])
    assert metrics["val/kappa_p90"] == pytest.approx(1.0)

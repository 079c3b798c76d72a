"""``training.selection``: which epoch's checkpoint a trial reads (val loss or a val metric)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from workers.train.config import TrainingConfig
from workers.train.selection import Selection, selected_metrics, selection_target

# A known history: val loss is lowest at epoch 4, val AMI highest at epoch 2.
HISTORY = {
    "val/loss": [3.0, 2.5, 2.2, 2.0, 2.1],
    "val/latent_ami": [0.10, 0.40, 0.30, 0.20, 0.25],
    "test/latent_ami": [0.11, 0.41, 0.31, 0.21, 0.26],
}


def run(training: TrainingConfig) -> Selection:
    selection = Selection(training.patience, training.min_epochs, training.min_delta,
                          **selection_target(training))
    net = torch.nn.Linear(1, 1)
    for epoch in range(1, 6):
        with torch.no_grad():
            net.weight.fill_(epoch)  # the weights say which epoch they come from
        selection.update(epoch, {k: v[epoch - 1] for k, v in HISTORY.items()}, net)
    return selection


def test_the_selection_field_changes_which_epoch_is_read():
    by_loss = run(TrainingConfig())
    by_ami = run(TrainingConfig(selection="val_metric", selection_metric="val/latent_ami"))
    assert (by_loss.best_epoch, by_ami.best_epoch) == (4, 2)
    assert by_ami.best_model["weight"].item() == 2.0  # the restored weights are epoch 2's
    assert selected_metrics(HISTORY, by_ami.best_epoch)["selected/test/latent_ami"] == 0.41
    assert selected_metrics(HISTORY, by_loss.best_epoch)["selected/test/latent_ami"] == 0.21
    # a lower-is-better metric is minimised: val/loss named as a metric reads epoch 4 again
    assert run(TrainingConfig(selection="val_metric", selection_metric="val/loss")).best_epoch == 4
    assert TrainingConfig().selection_rule == "lowest val/loss"
    assert TrainingConfig(selection="val_metric",
                          selection_metric="val/latent_ami").selection_rule == "highest val/latent_ami"


@pytest.mark.parametrize(("rates", "chosen"), [
    ([0.0, 0.1, 0.55, 0.9, 0.62], 5),   # epochs 3 and 5 on target (0.6 within 15%): 5 has the lower loss
    ([0.0, 0.1, 0.2, 0.3, 0.4], 2),     # never on target: the lowest val loss of all
    ([0.6, 0.1, 0.2, 0.3, 0.4], 1),     # on target only at epoch 1: it stays chosen
])
def test_under_a_target_rate_the_checkpoint_is_chosen_among_epochs_on_target(rates, chosen):
    history = {**HISTORY, "val/loss": [3.0, 1.0, 2.2, 2.0, 2.1], "val/kl": rates}
    selection = Selection(None, 1, 0.0, rate_target=0.6)
    for epoch in range(1, 6):
        selection.update(epoch, {k: v[epoch - 1] for k, v in history.items()}, torch.nn.Linear(1, 1))
    assert selection.best_epoch == chosen
    restored = Selection(None, 1, 0.0, rate_target=0.6)
    restored.load_state_dict(selection.state_dict())
    assert restored.on_target == selection.on_target  # a resumed trial keeps the rule


def test_early_stopping_reads_val_loss_whatever_the_selection():
    training = TrainingConfig(selection="val_metric", selection_metric="val/latent_ami", patience=1)
    selection = run(training)
    # val loss rises at epoch 5 for the first time: one bad epoch, patience 1, stopped
    assert selection.stopped and selection.best_loss == 2.0 and selection.best_epoch == 2


def test_a_missing_selection_metric_names_the_setting():
    selection = Selection(None, 1, 0.0, metric="val/latent_ami", maximise=True)
    with pytest.raises(KeyError, match="training.selection_metric"):
        selection.update(1, {"val/loss": 1.0}, torch.nn.Linear(1, 1))


@pytest.mark.parametrize(("fields", "words"), [
    ({"selection": "val_metric"}, "selection_metric is not set"),
    ({"selection_metric": "val/latent_ami"}, "selection is 'val_loss'"),
    ({"selection": "val_metric", "selection_metric": "test/latent_ami"}, "not a val metric"),
])
def test_bad_selection_fields_are_refused(fields, words):
    with pytest.raises(ValidationError, match=words):
        TrainingConfig(**fields)


def test_an_old_checkpoint_without_a_best_score_resumes_on_its_best_loss():
    selection = Selection(None, 1, 0.0)
    selection.load_state_dict({"best_loss": 2.0, "best_epoch": 4, "bad_epochs": 0,
                               "stopped": False, "best_model": None})
    selection.update(5, {"val/loss": 2.1}, torch.nn.Linear(1, 1))
    assert selection.best_epoch == 4


def test_a_trainer_reads_the_epoch_its_selection_metric_chose(tmp_path) -> None:
    from pathlib import Path

    from workers.data import KindProportions
    from workers.train import Trainer, load_trial_config

    config = load_trial_config(Path(__file__).resolve().parents[2] / "workers/examples/discrete.yaml")
    data = config.data.model_copy(update={
        "train_size": 128, "val_size": 64, "test_size": 64, "seed": None,
        "kind_proportions": KindProportions(prefix=1.0, diffuse=1.0, private=1.0)})
    training = TrainingConfig.model_validate({
        **config.training.model_dump(), "epochs": 4, "selection": "val_metric",
        "selection_metric": "val/latent_nmi"})
    trainer = Trainer.create(config.model_copy(update={
        "data": data, "training": training,
        "readouts": config.readouts.model_copy(update={"train_subset": 64, "gradient_batch": 0})}),
        tmp_path)
    trainer.run()
    curve = trainer.history["val/latent_nmi"]
    assert trainer.final_metrics["selected/epoch"] == 1 + curve.index(max(curve))
    assert trainer.final_metrics["selected/val/latent_nmi"] == max(curve)

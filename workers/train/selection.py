"""Early stopping on the trial's own val loss, and the checkpoint choice.

Early stopping reads ``val/loss`` only (contract.SELECTION_METRIC), never a test value: it
ends training after ``patience`` epochs in a row without an improvement of more than
``min_delta``, once ``min_epochs`` have run. The checkpoint is chosen on ``metric``
(``training.selection``: ``val/loss`` by default, or the ``selection_metric`` of
``val_metric``): the epoch with its lowest value, or its highest where ``maximise`` (ties:
the earlier one). The chosen epoch's model weights are kept (a copy on the model's device)
and restored at the end.

Under a target rate (``rate_target``) the checkpoint is chosen among the epochs whose val rate
is on target (within :data:`~workers.contract.RATE_TOLERANCE`): the comparison the report makes
is at one rate, and an epoch before the rate was reached (the latent still off) would otherwise
often have the lowest val loss. Until an epoch is on target every epoch competes; from the first
one on, only epochs on target do.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from workers.contract import (
    SELECTED_EPOCH,
    SELECTED_PREFIX,
    SELECTION_METRIC,
    STOP_EPOCH,
    VAL_KL,
    off_target,
    selection_maximises,
)
from workers.data import KINDS
from workers.readouts.speed import epochs_to_threshold, nmi_auc

NMI_THRESHOLD = 0.9
READOUT_PREFIXES = ("train/", "val/", "test/")


@dataclass
class Selection:
    """The early-stopping state of one trial (saved in its checkpoints)."""

    patience: int | None
    min_epochs: int
    min_delta: float
    first_epoch: int = 1  # epochs before it (autoencoder pre-training) are neither selected nor counted
    metric: str = SELECTION_METRIC  # what chooses the checkpoint
    maximise: bool = False
    best_loss: float = math.inf  # early stopping's best val/loss
    best_score: float = math.inf  # the chosen epoch's metric (negated where maximised): lower is better
    best_epoch: int = 0
    bad_epochs: int = 0
    stopped: bool = False
    rate_target: float | None = None  # kl target_rate: choose among epochs on target
    on_target: bool = False  # an epoch on target was seen: only such epochs compete from then on
    best_model: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    def update(self, epoch: int, metrics: dict[str, float], model: torch.nn.Module) -> None:
        """Record epoch ``epoch`` (1-based) from its metrics; may set ``stopped``.

        Raises:
            KeyError: the epoch's metrics lack the selection metric (naming the setting).
        """
        if epoch < self.first_epoch:
            return
        if self.metric not in metrics:
            raise KeyError(f"training.selection_metric {self.metric!r} was not logged at epoch "
                           f"{epoch} (a label-less dataset logs no latent recovery); choose a "
                           "logged val metric or selection: val_loss")
        value = metrics[self.metric]
        score = -value if self.maximise else value
        eligible = self.rate_target is None or off_target(metrics.get(VAL_KL), self.rate_target) is False
        if eligible and not self.on_target and self.rate_target is not None:
            self.on_target, self.best_score = True, math.inf  # the first epoch on target: start over
        # min_delta is in val/loss's units: it applies to the checkpoint choice on val/loss only
        delta = self.min_delta if self.metric == SELECTION_METRIC else 0.0
        if (eligible or not self.on_target) and math.isfinite(score) and score < self.best_score - delta:
            self.best_score, self.best_epoch = score, epoch
            self.best_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        loss = metrics[SELECTION_METRIC]
        if math.isfinite(loss) and loss < self.best_loss - self.min_delta:
            self.best_loss, self.bad_epochs = loss, 0
        else:
            self.bad_epochs += 1
        if self.patience is not None and epoch >= self.min_epochs and self.bad_epochs >= self.patience:
            self.stopped = True

    def state_dict(self) -> dict[str, Any]:
        return {key: copy.copy(getattr(self, key)) for key in
                ("best_loss", "best_score", "best_epoch", "bad_epochs", "stopped", "on_target",
                 "best_model")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        if "best_score" not in state:  # a checkpoint from before the choice could differ: val/loss chose
            self.best_score = self.best_loss


def trial_selection(training: Any) -> Selection:
    """A trial's :class:`Selection` from its ``TrainingConfig`` (epochs of autoencoder
    pre-training are neither selected nor counted; the trainer sets ``rate_target``)."""
    return Selection(training.patience, training.min_epochs, training.min_delta,
                     first_epoch=training.autoencoder_epochs + 1, **selection_target(training))


def selection_target(training: Any) -> dict[str, Any]:
    """``metric`` and ``maximise`` of a :class:`Selection` for a ``TrainingConfig``."""
    metric = training.selection_metric or SELECTION_METRIC
    return {"metric": metric, "maximise": selection_maximises(metric)}


def selected_metrics(history: dict[str, list[float]], epoch: int) -> dict[str, float]:
    """``selected/{name}`` = the value of every per-split metric at ``epoch`` (1-based)."""
    out = {SELECTED_EPOCH: float(epoch)}
    if epoch < 1:
        return out
    for name, values in history.items():
        if name.startswith(READOUT_PREFIXES) and len(values) >= epoch:
            out[SELECTED_PREFIX + name] = values[epoch - 1]
    return out


def speed_metrics(history: dict[str, list[float]], horizon: int, epochs: int,
                  kinds: tuple[str, ...] = KINDS) -> dict[str, float]:
    """NMI-AUC and epochs to NMI >= 0.9 (with censoring) for val and test, overall and per
    kind (``kinds``: a dataset's groups); absent where no NMI was logged (no label)."""
    out = {STOP_EPOCH: float(epochs)}
    for split in ("val", "test"):
        for kind in (None, *kinds):
            base = f"{split}/" if kind is None else f"{split}/{kind}/"
            curve = history.get(base + "latent_nmi")
            if not curve:
                continue
            out[base + "nmi_auc"] = nmi_auc(curve, horizon)
            reached, censored = epochs_to_threshold(curve, NMI_THRESHOLD)
            out[base + "epochs_to_nmi90"] = reached
            out[base + "epochs_to_nmi90_censored"] = censored
    return out

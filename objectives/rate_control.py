"""The target-rate control: a KL weight that a Lagrange multiplier sets so the rate meets a target.

With ``kl.options.target_rate`` R* the KL's weight is ``beta_t = exp(log_beta_t)``, and after
every counted optimizer step

    log_beta_{t+1} = clamp(log_beta_t + lr * (R_t - R*) / R*, log beta_min, log beta_max)

where R_t is the step's batch rate (:func:`batch_rate`, the logged ``{split}/kl``) and R* is
the train target (see below). A rate above
the target raises the price of information, one below lowers it; the multiplicative form keeps
beta positive, so the objective stays a beta-ELBO at every step and information is always priced
(a capacity target ``|KL - C|`` would instead reward information below C). The relative error
makes one step size fit targets of any size. The state is one tensor on the trainer's device,
updated without a host sync; it is read at epoch ends only (docs/concepts/rates.md).

Held out (``rate_control_held_out``, the default): an encoder spends more nats on rows it has
not trained on than on those it has, so a train rate held at the declared R* leaves val and test
above it. At each epoch's end the train target the steps steer to moves halfway to
``R* x train_rate / val_rate``, within [R*/4, 4 R*] (:meth:`RateControl.correct`): the gap is
read, not integrated, so a latent still switched off (both rates near 0) moves nothing.

A lone trial holds a 0-d state; a cohort stacks its members' states to ``[K]`` for the vmapped
loss (:meth:`RateControl.stack`) and writes each member's slice back (:meth:`RateControl.member`).
Torch only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from objectives.options import KLOptions

__all__ = ["RateControl", "batch_rate"]


def batch_rate(kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The batch's rate: the mean over examples with an active token of each one's KL in nats
    (``kl`` ``[B]``, or ``[B, D]`` summed over D); 0-d, on the device, detached."""
    kl = kl.detach()
    per_example = kl.sum(dim=-1) if kl.dim() == 2 else kl
    active = mask.any(dim=-1)
    return torch.where(active, per_example, 0.0).sum() / active.sum().clamp_min(1)


@dataclass
class RateControl:
    """The multiplier's state (``log_beta``, float64, any shape) and its fixed settings.

    Attributes:
        log_beta: log of the KL weight in effect: ``[]`` for a trial, ``[K]`` for a cohort group.
        target: R* in nats per example.
        lr: the step size of log beta per unit of relative rate error.
        min_beta, max_beta: the bounds beta is kept within.
        held_out: whether :meth:`correct` moves the train target (else it stays R*).
        train_target: the rate the steps steer to (``log_beta``'s shape, float64); R* at the start.
    """

    log_beta: torch.Tensor
    target: float
    lr: float
    min_beta: float
    max_beta: float
    held_out: bool
    train_target: torch.Tensor

    @classmethod
    def create(cls, options: KLOptions, beta: float, device: torch.device | str = "cpu") -> RateControl | None:
        """The control of a KL term with these options, starting at weight ``beta`` (the term's
        trained weight); None when ``options.target_rate`` is unset."""
        if options.target_rate is None:
            return None
        if not beta > 0:
            raise ValueError(f"the target-rate controller starts at the kl weight, which must be > 0 "
                             f"(got {beta:g}); set terms.kl.weight to a positive beta")
        start = min(max(beta, options.rate_control_min_beta), options.rate_control_max_beta)
        target = options.target_rate
        return cls(torch.tensor(math.log(start), dtype=torch.float64, device=device),
                   target, options.rate_control_lr,
                   options.rate_control_min_beta, options.rate_control_max_beta,
                   options.rate_control_held_out,
                   torch.tensor(target, dtype=torch.float64, device=device))

    @property
    def beta(self) -> torch.Tensor:
        """The KL weight in effect (a tensor of ``log_beta``'s shape, on its device)."""
        return self.log_beta.exp()

    def update(self, rate: torch.Tensor) -> None:
        """One controller step from the batch rate(s) ``rate`` (``log_beta``'s shape); no host sync."""
        error = (rate.detach().to(self.log_beta.dtype) - self.train_target) / self.train_target
        self.log_beta = (self.log_beta + self.lr * error).clamp(math.log(self.min_beta), math.log(self.max_beta))

    def correct(self, held_out_rate: float, train_rate: float) -> None:
        """An epoch end: move the train target halfway to R* x ``train_rate`` / ``held_out_rate``
        (the epoch's train rate over its val rate: the gap an encoder opens between rows it
        trained on and rows it did not), within [R*/4, 4 R*]. Nothing when ``held_out`` is off,
        a rate is not a number, or the train rate is under R*/10 (no gap to read yet)."""
        if not (self.held_out and math.isfinite(held_out_rate) and math.isfinite(train_rate)):
            return
        if train_rate < self.target / 10 or held_out_rate <= 0:
            return
        wanted = self.target * train_rate / held_out_rate
        self.train_target = (0.5 * self.train_target + 0.5 * wanted).clamp(self.target / 4, self.target * 4)

    @classmethod
    def stack(cls, controls: Sequence[RateControl]) -> RateControl:
        """The members' controls as one of shape ``[K]`` (their settings must agree)."""
        first = controls[0]
        settings = {(c.target, c.lr, c.min_beta, c.max_beta, c.held_out) for c in controls}
        if len(settings) > 1:
            raise ValueError(f"stacked rate controls must share their settings, got {sorted(settings)}")
        return cls(torch.stack([c.log_beta for c in controls]), first.target, first.lr,
                   first.min_beta, first.max_beta, first.held_out,
                   torch.stack([c.train_target for c in controls]))

    def member(self, index: int) -> RateControl:
        """Member ``index``'s control, cut from a stacked one (its own copy of the state)."""
        return RateControl(self.log_beta[index].clone(), self.target, self.lr, self.min_beta,
                           self.max_beta, self.held_out, self.train_target[index].clone())

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (the settings come back from the trial's config)."""
        return {"log_beta": self.log_beta.detach().cpu().clone(),
                "train_target": self.train_target.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s multiplier and train target onto this control's device
        (a checkpoint from before the train target: R*)."""
        self.log_beta = state["log_beta"].to(device=self.log_beta.device, dtype=torch.float64)
        target = state.get("train_target")
        self.train_target = (torch.full_like(self.log_beta, self.target) if target is None
                             else target.to(device=self.log_beta.device, dtype=torch.float64))

"""The metrics of one train batch, which an epoch averages into its train read-outs.

The lone trainer and the cohort both take them from here, so a member's train metrics are the
ones its lone trial would log. They stay on the device until the epoch's logging point.
"""

from __future__ import annotations

import torch

from objectives.rate_control import RateControl, batch_rate
from objectives.stack import LossStack
from workers.contract import TRAIN_KL_MULTIPLIER, TRAIN_KL_TRAIN_TARGET
from workers.models import CVAEOutput
from workers.models.backbone import upcast
from workers.readouts.evaluate import DIAGNOSTIC_TERMS

__all__ = ["RUNNING_TRAIN_METRICS", "batch_metrics", "divergence", "kl_multiplier_metrics"]

# Overall train names kept from the running means of the epoch's steps (not the eval pass).
RUNNING_TRAIN_METRICS = ("loss", "kl", *DIAGNOSTIC_TERMS)


def batch_metrics(stack_out, diag_out, output: CVAEOutput,
                  mask: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per-batch metric tensors (on the device) and the batch's count of active examples."""
    count = mask.any(dim=-1).sum()
    # The rate: what a target-rate control reads (objectives/rate_control.py), the logged kl.
    values = {"loss": stack_out.total.detach(), "kl": batch_rate(upcast(output.kl), mask)}
    for metric, term in DIAGNOSTIC_TERMS.items():
        values[metric] = diag_out.terms[term].detach()
    return values, count


def kl_multiplier_metrics(control: RateControl | None, stack: LossStack, step: int) -> dict[str, float]:
    """``train/kl_multiplier``: the KL weight in effect at the last step taken before ``step``
    (the target-rate control's multiplier, else ``stack``'s scheduled weight, pre-training
    included); empty without a kl term. Under a target rate also ``train/kl_train_target``, the
    rate the steps steered to. A logging point: it reads the control off the device."""
    if control is not None:
        return {TRAIN_KL_MULTIPLIER: float(control.beta), TRAIN_KL_TRAIN_TARGET: float(control.train_target)}
    weights = stack.weights_at(max(step - 1, 0))
    return {TRAIN_KL_MULTIPLIER: weights["kl"]} if "kl" in weights else {}


def divergence(losses: torch.Tensor, terms: dict[str, torch.Tensor], first_step: int,
               epoch: int) -> str | None:
    """Where an epoch's training diverged, in words, or None when every step's loss is finite.

    ``losses``: ``[S]`` the epoch's step losses; ``terms``: each term's ``[S]`` values (named in
    the message at the first non-finite step); ``epoch``: the epoch's 0-based index. A logging
    point: one host sync. The lone trainer and a cohort's members word it alike.
    """
    finite = torch.isfinite(losses)
    if bool(finite.all()):
        return None
    bad = int((~finite).nonzero()[0])
    detail = ", ".join(f"{key}={float(values[bad]):.6g}" for key, values in terms.items())
    return (f"loss became {float(losses[bad])} at step {first_step + bad} (epoch {epoch + 1}); "
            f"terms: {detail}")

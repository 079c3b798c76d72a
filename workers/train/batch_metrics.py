"""The metrics of one train batch, which an epoch averages into its train read-outs.

The lone trainer and the cohort both take them from here, so a member's train metrics are the
ones its lone trial would log. They stay on the device until the epoch's logging point.
"""

from __future__ import annotations

import torch

from workers.models import CVAEOutput
from workers.models.backbone import upcast
from workers.readouts.evaluate import DIAGNOSTIC_TERMS

__all__ = ["RUNNING_TRAIN_METRICS", "batch_metrics"]

# Overall train names kept from the running means of the epoch's steps (not the eval pass).
RUNNING_TRAIN_METRICS = ("loss", "kl", *DIAGNOSTIC_TERMS)


def batch_metrics(stack_out, diag_out, output: CVAEOutput,
                  mask: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per-batch metric tensors (on the device) and the batch's count of active examples."""
    active = mask.any(dim=-1)
    kl = upcast(output.kl)
    kl_per_example = kl.sum(dim=-1) if kl.dim() == 2 else kl
    count = active.sum()
    values = {
        "loss": stack_out.total.detach(),
        "kl": torch.where(active, kl_per_example.detach(), 0.0).sum() / count.clamp_min(1),
    }
    for metric, term in DIAGNOSTIC_TERMS.items():
        values[metric] = diag_out.terms[term].detach()
    return values, count

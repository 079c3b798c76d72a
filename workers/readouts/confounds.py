"""What a latent's clusters share with nuisance variables: length and concentration.

A latent that "recovers" a label may only have sorted examples by target length or by
kappa, which can both differ between classes. ``latent_nmi_length`` and
``latent_nmi_kappa`` are the NMI of the latent's assignment with the quartile bins of the
target length and of kappa_alpha (at the trial's alpha), read beside the NMI against the
label: a recovery that these explain is not evidence about the label.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from workers.contract import LATENT_NMI_KAPPA, LATENT_NMI_LENGTH
from workers.readouts.recovery import latent_recovery


def quartile_bins(values: np.ndarray) -> np.ndarray | None:
    """Quartile bin (0..3) of each value; None when the values do not fill two bins."""
    edges = np.unique(np.quantile(values, [0.25, 0.5, 0.75]))
    bins = np.digitize(values, edges, right=True)
    return bins if len(np.unique(bins)) >= 2 else None


def confound_readouts(assignment: torch.Tensor, mask: torch.Tensor, kappa: torch.Tensor) -> dict[str, float]:
    """NMI of ``assignment [N]`` with the quartiles of each row's active length and ``kappa``;
    NaN for a variable without two distinct bins (kappa at alpha 0) or an empty split."""
    out = {LATENT_NMI_LENGTH: math.nan, LATENT_NMI_KAPPA: math.nan}
    if assignment.numel() == 0:
        return out
    inferred = assignment.cpu().numpy()
    for name, values in ((LATENT_NMI_LENGTH, mask.sum(-1)), (LATENT_NMI_KAPPA, kappa)):
        bins = quartile_bins(values.detach().double().cpu().numpy())
        if bins is not None:
            out[name] = latent_recovery(inferred, bins)["latent_nmi"]
    return out

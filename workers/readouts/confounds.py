"""What a latent's clusters share with nuisance variables: length and concentration.

A latent that "recovers" a label may only have sorted examples by target length or by
kappa, which can both differ between classes. ``latent_nmi_length`` and
``latent_nmi_kappa`` are the NMI of the latent's assignment with the quartile bins of the
target length and of kappa_alpha (at the trial's alpha), read beside the NMI against the
label: a recovery that these explain is not evidence about the label. ``latent_ami_within_length``
is AMI conditional on length: the latent's AMI with the label within each length quartile,
averaged with the quartiles' sizes as weights (1 for a latent that is the label; 0 in
expectation for one that only sorts examples by length).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from workers.contract import LATENT_AMI_WITHIN_LENGTH, LATENT_NMI_KAPPA, LATENT_NMI_LENGTH
from workers.readouts.recovery import chance_readouts, latent_recovery


def quartile_bins(values: np.ndarray) -> np.ndarray | None:
    """Quartile bin (0..3) of each value; None when the values do not fill two bins."""
    edges = np.unique(np.quantile(values, [0.25, 0.5, 0.75]))
    bins = np.digitize(values, edges, right=True)
    return bins if len(np.unique(bins)) >= 2 else None


def ami_within_bins(inferred: np.ndarray, truth: np.ndarray, bins: np.ndarray) -> float:
    """The AMI of ``inferred`` with ``truth`` within each bin, weighted by the bins' sizes.

    A bin of one row has no AMI and is left out (its weight too); NaN when no bin is left. A
    bin where the truth has one class gives AMI 0 unless ``inferred`` is constant there too
    (scikit-learn's convention: two one-cluster labelings agree perfectly).
    """
    total, weight = 0.0, 0
    for b in np.unique(bins):
        rows = bins == b
        if rows.sum() < 2:
            continue
        ami = chance_readouts(inferred[rows], truth[rows], shuffles=1)["latent_ami"]
        total, weight = total + float(rows.sum()) * ami, weight + int(rows.sum())
    return total / weight if weight else math.nan


def confound_readouts(assignment: torch.Tensor, mask: torch.Tensor, kappa: torch.Tensor,
                      truth: torch.Tensor | None = None) -> dict[str, float]:
    """NMI of ``assignment [N]`` with the quartiles of each row's active length and ``kappa``;
    NaN for a variable without two distinct bins (kappa at alpha 0) or an empty split. With the
    labels ``truth [N]``: the AMI within length quartiles (:func:`ami_within_bins`)."""
    out = {LATENT_NMI_LENGTH: math.nan, LATENT_NMI_KAPPA: math.nan}
    if truth is not None:
        out[LATENT_AMI_WITHIN_LENGTH] = math.nan
    if assignment.numel() == 0:
        return out
    inferred = assignment.cpu().numpy()
    for name, values in ((LATENT_NMI_LENGTH, mask.sum(-1)), (LATENT_NMI_KAPPA, kappa)):
        bins = quartile_bins(values.detach().double().cpu().numpy())
        if bins is not None:
            out[name] = latent_recovery(inferred, bins)["latent_nmi"]
    if truth is not None:
        bins = quartile_bins(mask.sum(-1).double().cpu().numpy())
        out[LATENT_AMI_WITHIN_LENGTH] = ami_within_bins(
            inferred, truth.cpu().numpy(), bins if bins is not None else np.zeros(len(inferred), int))
    return out

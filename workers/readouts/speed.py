"""Speed read-outs of a per-epoch curve (NMI on val or test).

- ``nmi_auc``: the normalised area under the curve over a fixed horizon of H epochs, i.e.
  the mean of the values at epochs 1..H, in [0, 1] for NMI. A run that stopped early (or
  is shorter than H) is padded with its last value: training ended at a plateau, so the
  curve is taken to stay there. Epochs past H are ignored, so runs of different lengths
  compare on the same horizon.
- ``epochs_to_nmi90``: the first epoch (1-based) whose value is >= the threshold (0.9).
  When no epoch reaches it the value is the number of epochs trained and
  ``epochs_to_nmi90_censored`` is 1 (right-censored: "more than this"), else 0.
NaN values count as not reaching the threshold; an all-NaN or empty curve gives NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def nmi_auc(curve: Sequence[float], horizon: int) -> float:
    """Mean of the curve over epochs 1..horizon, padded with its last value."""
    if horizon < 1:
        raise ValueError(f"readouts.nmi_auc_horizon must be >= 1, got {horizon}")
    values = list(curve)[:horizon]
    if not values or all(math.isnan(v) for v in values):
        return math.nan
    values += [values[-1]] * (horizon - len(values))
    return sum(values) / horizon


def epochs_to_threshold(curve: Sequence[float], threshold: float = 0.9) -> tuple[float, float]:
    """``(epochs, censored)``; see the module docstring."""
    values = list(curve)
    if not values or all(math.isnan(v) for v in values):
        return math.nan, math.nan
    for epoch, value in enumerate(values, start=1):
        if value >= threshold:
            return float(epoch), 0.0
    return float(len(values)), 1.0

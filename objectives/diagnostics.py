"""Per-batch and per-epoch diagnostics of the concentration factor, and the baseline self-check."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from objectives._checks import check_alpha, check_pair
from objectives.reference_scale import ReferenceScale
from objectives.token_weighting import (
    TokenWeightStats,
    divide_by_kappa,
    masked_example_mean,
    r_tok_from_stats,
    weight_stats_unchecked,
)

__all__ = [
    "KAPPA_SUMMARY_KEYS",
    "kappa_summary",
    "KappaSummaryAccumulator",
    "squared_coefficient_of_variation",
    "BaselineSelfCheck",
    "baseline_self_check",
]

KAPPA_SUMMARY_KEYS = (
    "kappa_mean",
    "kappa_p50",
    "kappa_p90",
    "kappa_max",
    "cv2_mean",
    "inv_kappa_mean",
    "inv_kappa_min",
    "inv_kappa_max",
    "inv_kappa_ess_fraction",
)


def squared_coefficient_of_variation(base_nll: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """CV(b)^2 per example with the population variance over active tokens, ``[B]`` float64.

    Computed as kappa_1 - 1 (so in log space); 0 on all-zero and empty rows.
    """
    check_pair(base_nll, mask)
    stats = weight_stats_unchecked(base_nll, mask, 1.0)
    return torch.where(stats.n_active > 0, stats.kappa - 1.0, 0.0)


def _summarise(kappa: torch.Tensor, cv2: torch.Tensor) -> dict[str, torch.Tensor]:
    """Summary over the given rows (all with an active token), as 0-d float64 tensors."""
    if kappa.numel() == 0:
        nan = torch.full((), float("nan"), dtype=torch.float64, device=kappa.device)
        return dict.fromkeys(KAPPA_SUMMARY_KEYS, nan)
    kappa = kappa.to(torch.float64)
    quantiles = torch.quantile(kappa, torch.tensor([0.5, 0.9], dtype=torch.float64, device=kappa.device))
    inverse = 1.0 / kappa
    # Kish's effective sample size of the implied example weights, as a fraction of the batch:
    # 1 when every example keeps the same weight, small when a few examples dominate.
    ess_fraction = inverse.sum() ** 2 / (inverse.numel() * (inverse**2).sum())
    return {
        "kappa_mean": kappa.mean(),
        "kappa_p50": quantiles[0],
        "kappa_p90": quantiles[1],
        "kappa_max": kappa.max(),
        "cv2_mean": cv2.to(torch.float64).mean(),
        "inv_kappa_mean": inverse.mean(),
        "inv_kappa_min": inverse.min(),
        "inv_kappa_max": inverse.max(),
        "inv_kappa_ess_fraction": ess_fraction,
    }


def kappa_summary(
    base_nll: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    stats: TokenWeightStats | None = None,
) -> dict[str, torch.Tensor]:
    """Summary of kappa_alpha over the examples of a batch that have an active token.

    Keys: ``kappa_mean``, ``kappa_p50``, ``kappa_p90``, ``kappa_max``, ``cv2_mean`` (mean
    CV(b)^2), and the implied example weights 1/kappa: ``inv_kappa_mean``, ``inv_kappa_min``,
    ``inv_kappa_max`` and ``inv_kappa_ess_fraction`` (Kish effective sample size / count).
    Values are 0-d float64 tensors (NaN when no row is active). Selecting the active rows
    synchronises with the device: call this at logging points.

    Args:
        stats: precomputed stats at ``alpha`` (e.g. ``LossOutput.stats``) to skip recomputing.
    """
    check_pair(base_nll, mask)
    alpha_value = check_alpha(alpha)
    if stats is None:
        stats = weight_stats_unchecked(base_nll, mask, alpha_value)
    active = stats.n_active > 0
    cv2 = squared_coefficient_of_variation(base_nll, mask)
    return _summarise(stats.kappa[active], cv2[active])


class KappaSummaryAccumulator:
    """Collects per-example kappa and CV(b)^2 over an epoch, then summarises them once.

    Quantiles over an epoch are not means of per-batch quantiles, so the per-example
    values are kept (on their device; ``update`` does not synchronise).
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = check_alpha(alpha)
        self._kappa: list[torch.Tensor] = []
        self._cv2: list[torch.Tensor] = []
        self._active: list[torch.Tensor] = []

    def update(
        self, base_nll: torch.Tensor, mask: torch.Tensor, stats: TokenWeightStats | None = None
    ) -> None:
        """Add a batch (``stats`` at this accumulator's alpha may be passed to save work)."""
        check_pair(base_nll, mask)
        if stats is None:
            stats = weight_stats_unchecked(base_nll, mask, self.alpha)
        self._kappa.append(stats.kappa.detach().to(torch.float64))
        self._cv2.append(squared_coefficient_of_variation(base_nll, mask))
        self._active.append(stats.n_active > 0)

    def compute(self) -> dict[str, torch.Tensor]:
        """The summary over every example added so far (see :func:`kappa_summary`)."""
        if not self._kappa:
            return _summarise(torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64))
        kappa, cv2, active = torch.cat(self._kappa), torch.cat(self._cv2), torch.cat(self._active)
        return _summarise(kappa[active], cv2[active])

    def kappa_values(self) -> torch.Tensor:
        """Per-example kappa of every active example seen (for histograms), float64 on CPU."""
        if not self._kappa:
            return torch.zeros(0, dtype=torch.float64)
        return torch.cat(self._kappa)[torch.cat(self._active)].cpu()


@dataclass(frozen=True)
class BaselineSelfCheck:
    """Result of the baseline self-check.

    Attributes:
        mean_r_hat: mean R^ over the batch with l = b and c_base measured on it (ideally 1).
        deviation: ``|mean_r_hat - 1|``.
        passed: ``deviation <= tolerance``.
        reason: why the check failed, empty when it passed.
    """

    mean_r_hat: float
    deviation: float
    passed: bool
    reason: str = ""


def baseline_self_check(
    base_nll: torch.Tensor, mask: torch.Tensor, alpha: float, *, tolerance: float = 1e-5
) -> BaselineSelfCheck:
    """Check that with ``l = b`` the batch mean of R^ is 1 when c_base is measured on the batch.

    This is the identity E[R^_base] = E[b_u] / c_base = 1 (docs/concepts/objectives.md), evaluated
    through the same code path the losses use; a failure means the weighting or the
    normalisation is broken for these inputs (e.g. non-finite surprisal). Host sync:
    call it at logging points.
    """
    check_pair(base_nll, mask)
    alpha_value = check_alpha(alpha)
    scale = ReferenceScale()
    scale.update(base_nll, mask)
    try:
        c_base = scale.compute()
    except ValueError as error:
        return BaselineSelfCheck(float("nan"), float("nan"), False, str(error))
    stats = weight_stats_unchecked(base_nll, mask, alpha_value)
    r_hat = divide_by_kappa(r_tok_from_stats(base_nll.detach(), mask, stats), stats) / c_base
    mean_r_hat = float(masked_example_mean(r_hat, mask))
    deviation = abs(mean_r_hat - 1.0)
    passed = deviation <= tolerance
    reason = "" if passed else (
        f"baseline self-check failed: mean R^ with l = b is {mean_r_hat!r}, "
        f"|mean - 1| = {deviation:.3g} > {tolerance:g} (alpha = {alpha_value:g})"
    )
    return BaselineSelfCheck(mean_r_hat, deviation, passed, reason)

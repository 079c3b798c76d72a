"""Tempered surprisal-share token weights and the reconstructions built on them.

Notation follows docs/concepts/objectives.md: for one example with active tokens S (n = |S|),
``b_t`` is the z-free base surprisal, ``l_t`` the CVAE token loss, ``m_r = (1/n) sum_S b_t^r``,
``pi_t = b_t^alpha / sum_S b_s^alpha`` and ``kappa = m_{alpha+1} / (m_alpha m_1)``. Statistics
of ``b`` are computed in log space and float64 (:func:`token_weight_stats` gives the
conventions for zeros and empty rows); gradients flow through ``token_nll`` only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from objectives._checks import (
    check_alpha,
    check_c_base,
    check_pair,
    check_token_nll,
    check_values,
)

_COMPUTE_DTYPE = torch.float64

__all__ = [
    "TokenWeightStats",
    "token_weight_stats",
    "token_weighted_reconstruction",
    "concentration_corrected_reconstruction",
    "normalized_concentration_corrected_reconstruction",
    "normalized_concentration_corrected_token_weighted_reconstruction_loss",
    "uniform_reconstruction",
    "masked_example_mean",
]


class TokenWeightStats(NamedTuple):
    """Per-example statistics of the z-free surprisal under alpha-tempered weighting.

    Attributes:
        weights: ``[B, T]`` pi_t; 0 off the mask; each row with an active token sums to 1.
        kappa: ``[B]`` concentration factor ``m_{alpha+1} / (m_alpha m_1)``; >= 1 on rows
            with an active token (exactly 1 at alpha = 0 and on all-zero rows), 0 on empty rows.
        base_uniform: ``[B]`` b_u, the uniform mean of b over active tokens (0 on empty rows).
        base_weighted: ``[B]`` R_tok^base = ``sum_t pi_t b_t = m_{alpha+1} / m_alpha``.
        n_active: ``[B]`` int64 count of active tokens.
    """

    weights: torch.Tensor
    kappa: torch.Tensor
    base_uniform: torch.Tensor
    base_weighted: torch.Tensor
    n_active: torch.Tensor


def weight_stats_unchecked(
    base_nll: torch.Tensor, mask: torch.Tensor, alpha: float, dtype: torch.dtype | None = None
) -> TokenWeightStats:
    """The statistics, computed in float64 and returned in ``dtype`` (default float64).

    The masked logsumexps share one shift: with ``mx = max_S log b`` and
    ``u_t = log b_t - mx <= 0``, ``S_r = sum_S b^r = exp(r mx) sum_S exp(r u)``; the
    factors ``exp(r mx)`` cancel in pi and kappa, and the shifted sums are >= 1
    (the max token contributes exp(0)), so nothing overflows or underflows.
    """
    b = base_nll.detach().to(_COMPUTE_DTYPE)
    # Off-mask entries may hold anything (padding, inf, NaN): replace them before any arithmetic.
    b = torch.where(mask, b, 0.0)
    n_active = mask.sum(dim=-1)
    has_active = n_active > 0
    n = n_active.clamp_min(1).to(_COMPUTE_DTYPE)
    uniform_weights = mask.to(_COMPUTE_DTYPE) / n.unsqueeze(-1)
    base_uniform = b.sum(dim=-1) / n

    if alpha == 0.0:
        # Exact continuity at alpha = 0: uniform weights, kappa = 1, R_tok^base = b_u.
        kappa = has_active.to(_COMPUTE_DTYPE)
        return _cast(TokenWeightStats(uniform_weights, kappa, base_uniform, base_uniform, n_active), dtype)

    # b_t = 0 (and every off-mask entry, zeroed above) gets weight 0: log 0 = -inf. The zeros
    # are kept away from log and exp all the same, because CPU kernels take a slow path on
    # -inf (about 200x slower per element), which padding alone would otherwise trigger.
    zero = b == 0
    log_b = torch.log(torch.where(zero, 1.0, b))
    max_log_b = torch.where(zero, float("-inf"), log_b).amax(dim=-1, keepdim=True)
    # A row is "positive" when some active b_t > 0; all-zero and empty rows take the
    # conventions below instead of the NaN their -inf shift would give.
    positive = max_log_b.squeeze(-1) > float("-inf")
    shifted = torch.where(zero, 0.0, log_b - torch.where(positive.unsqueeze(-1), max_log_b, 0.0))
    power_one = torch.where(zero, 0.0, torch.exp(shifted))  # b / max b
    # alpha * log(b / max b), i.e. xlogy(alpha, b / max b) for alpha > 0 (b = 0 -> weight 0).
    power_alpha = torch.where(zero, 0.0, torch.exp(alpha * shifted))
    sum_alpha = power_alpha.sum(dim=-1)
    sum_alpha_plus_one = (power_alpha * power_one).sum(dim=-1)
    sum_one = power_one.sum(dim=-1)
    safe_sum_alpha = torch.where(positive, sum_alpha, 1.0)
    weights = torch.where(
        positive.unsqueeze(-1), power_alpha / safe_sum_alpha.unsqueeze(-1), uniform_weights
    )
    ratio = sum_alpha_plus_one / safe_sum_alpha  # R_tok^base / max b, in (0, 1]
    # kappa >= 1 holds exactly (Chebyshev's sum inequality); clamp away the last-ulp rounding.
    kappa_positive = (n * ratio / torch.where(positive, sum_one, 1.0)).clamp_min(1.0)
    kappa = torch.where(positive, kappa_positive, has_active.to(_COMPUTE_DTYPE))
    max_b = torch.exp(torch.where(positive, max_log_b.squeeze(-1), 0.0))
    base_weighted = torch.where(positive, ratio * max_b, 0.0)
    return _cast(TokenWeightStats(weights, kappa, base_uniform, base_weighted, n_active), dtype)


def _cast(stats: TokenWeightStats, dtype: torch.dtype | None) -> TokenWeightStats:
    if dtype is None or dtype == stats.kappa.dtype:
        return stats
    return TokenWeightStats(
        stats.weights.to(dtype),
        stats.kappa.to(dtype),
        stats.base_uniform.to(dtype),
        stats.base_weighted.to(dtype),
        stats.n_active,
    )


def _prepare(
    token_nll: torch.Tensor | None,
    base_nll: torch.Tensor,
    mask: torch.Tensor,
    alpha: object,
    validate: bool,
) -> float:
    check_pair(base_nll, mask)
    if token_nll is not None:
        check_token_nll(token_nll, base_nll)
    alpha_value = check_alpha(alpha)
    if validate:
        check_values(base_nll, mask, token_nll)
    return alpha_value


def token_weight_stats(
    base_nll: torch.Tensor, mask: torch.Tensor, alpha: float, *, validate: bool = False
) -> TokenWeightStats:
    """Tempered surprisal-share weights pi and the concentration factor kappa.

    Every statistic of ``b`` is computed in log space (``xlogy`` plus a masked
    logsumexp) and in float64, whatever the input dtype: ``b ** alpha`` overflows
    float32 at b = 100, alpha = 20 and underflows for b < 1e-20, while the [B, T]
    tensors involved are tiny next to the decoder's logits, so the extra precision
    costs nothing measurable. Results are cast back to the inputs' dtype.

    Conventions (docs/concepts/objectives.md, "Numerical conventions"):
      * alpha = 0 is exactly uniform, also where b_t = 0 (``xlogy(0, 0) = 0``).
      * alpha > 0 and b_t = 0: that token gets weight 0. If every active b_t of a
        row is 0 the row falls back to uniform weights and kappa = 1, the limit of
        a row of equal tiny surprisals.
      * A row with no active token gives 0 for every per-example value (weights,
        kappa, b_u, R_tok, ...), is left out of batch means, and produces no NaN in
        values or gradients.
      * Gradients flow only through ``token_nll``; ``base_nll`` is detached.

    Args:
        base_nll: ``[B, T]`` float z-free surprisal b_t (no gradient is taken through it).
        mask: ``[B, T]`` bool, True on the active y-region tokens.
        alpha: concentration knob, a finite real >= 0.
        validate: also check that b is finite and >= 0 on active tokens (a host sync).

    Returns:
        TokenWeightStats in ``base_nll``'s dtype (``n_active`` is int64).

    Raises:
        ValueError: alpha < 0 or not finite, a shape mismatch, a non-bool mask, a
            non-float base_nll, or (with ``validate``) non-finite or negative b.
    """
    alpha_value = _prepare(None, base_nll, mask, alpha, validate)
    return weight_stats_unchecked(base_nll, mask, alpha_value, base_nll.dtype)


def working_dtype(token_nll: torch.Tensor, base_nll: torch.Tensor) -> torch.dtype:
    """The dtype reconstructions are returned in: the promotion of both inputs' dtypes."""
    return torch.promote_types(token_nll.dtype, base_nll.dtype)


def r_tok_from_stats(token_nll: torch.Tensor, mask: torch.Tensor, stats: TokenWeightStats) -> torch.Tensor:
    """``sum_t pi_t l_t`` in the stats' dtype; off-mask l (maybe inf/NaN padding) is zeroed first."""
    token = torch.where(mask, token_nll, 0.0).to(stats.weights.dtype)
    return (stats.weights * token).sum(dim=-1)


def divide_by_kappa(r_tok: torch.Tensor, stats: TokenWeightStats) -> torch.Tensor:
    """R~ = R_tok / kappa; kappa is 0 only on empty rows, whose R_tok is 0: divide by 1 there."""
    return r_tok / torch.where(stats.n_active > 0, stats.kappa, 1.0)


def uniform_reconstruction(
    token_nll: torch.Tensor, mask: torch.Tensor, *, validate: bool = False
) -> torch.Tensor:
    """Per-example uniform mean of ``token_nll`` over active tokens, ``[B]`` (0 on empty rows)."""
    check_pair(token_nll, mask, name="token_nll")
    if validate:
        bad = ~torch.isfinite(token_nll.detach()[mask])
        if bool(bad.any()):
            raise ValueError(f"token_nll must be finite on active tokens; found {int(bad.sum())}")
    n = mask.sum(dim=-1).clamp_min(1).to(token_nll.dtype)
    return torch.where(mask, token_nll, 0.0).sum(dim=-1) / n


def token_weighted_reconstruction(
    token_nll: torch.Tensor,
    base_nll: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """R_tok,alpha = ``sum_t pi_t l_t`` per example, ``[B]``.

    At alpha = 0 this is the uniform token mean of l. Empty rows give 0.
    """
    alpha_value = _prepare(token_nll, base_nll, mask, alpha, validate)
    stats = weight_stats_unchecked(base_nll, mask, alpha_value, working_dtype(token_nll, base_nll))
    return r_tok_from_stats(token_nll, mask, stats)


def concentration_corrected_reconstruction(
    token_nll: torch.Tensor,
    base_nll: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """R~ = R_tok / kappa = ``b_u * sum b^alpha l / sum b^(alpha+1)`` per example, ``[B]``.

    With ``l = b`` it equals b_u exactly (up to rounding). All-zero rows have
    kappa = 1, so R~ = R_tok = mean l there. Empty rows give 0.
    """
    alpha_value = _prepare(token_nll, base_nll, mask, alpha, validate)
    stats = weight_stats_unchecked(base_nll, mask, alpha_value, working_dtype(token_nll, base_nll))
    return divide_by_kappa(r_tok_from_stats(token_nll, mask, stats), stats)


def normalized_concentration_corrected_reconstruction(
    token_nll: torch.Tensor,
    base_nll: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    c_base: float,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """R^ = R~ / c_base per example, ``[B]``.

    Args:
        c_base: the distribution-level reference scale E_D[b_u] (see ReferenceScale),
            a positive finite float.

    Raises:
        ValueError: as token_weight_stats, plus a c_base that is not positive and finite.
    """
    c_value = check_c_base(c_base)
    alpha_value = _prepare(token_nll, base_nll, mask, alpha, validate)
    stats = weight_stats_unchecked(base_nll, mask, alpha_value, working_dtype(token_nll, base_nll))
    return divide_by_kappa(r_tok_from_stats(token_nll, mask, stats), stats) / c_value


def masked_example_mean(per_example: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``per_example [B]`` over rows with at least one active token (0 if none).

    Each example counts once, however many tokens it has, as c_base does.
    """
    has_active = mask.any(dim=-1)
    count = has_active.sum().clamp_min(1).to(per_example.dtype)
    return torch.where(has_active, per_example, 0.0).sum() / count


def normalized_concentration_corrected_token_weighted_reconstruction_loss(
    token_nll: torch.Tensor,
    base_nll: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    c_base: float,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """The scalar training loss: the batch mean of R^ over examples with an active token.

    A batch with no active token at all gives 0 (still connected to ``token_nll``,
    with zero gradient).
    """
    per_example = normalized_concentration_corrected_reconstruction(
        token_nll, base_nll, mask, alpha, c_base, validate=validate
    )
    return masked_example_mean(per_example, mask)

"""Read-outs that depend on the surprisal only: b_t (z-free) and h_t (given the true s).

kappa and 1/kappa, b_u, and the share of the pi-weighted surprisal the true strategy explains
(:func:`surprisal_readouts`), per split and per kind, computed once per split: they do not
depend on the model.
"""

from __future__ import annotations

import math

import torch

from objectives import token_weight_stats
from workers.data import KINDS

QUANTILES = {"p10": 0.1, "p50": 0.5, "p90": 0.9}


def _quantile_stats(values: torch.Tensor, prefix: str) -> dict[str, float]:
    if values.numel() == 0:
        return {f"{prefix}_{k}": math.nan for k in ("mean", *QUANTILES)}
    q = torch.quantile(values, torch.tensor(list(QUANTILES.values()), dtype=values.dtype))
    out = {f"{prefix}_mean": float(values.mean())}
    out.update({f"{prefix}_{name}": float(v) for name, v in zip(QUANTILES, q, strict=True)})
    return out


def surprisal_readouts(
    base_nll: torch.Tensor, cond_nll: torch.Tensor | None, mask: torch.Tensor, alpha: float
) -> dict[str, float]:
    """The read-outs of the rows given (``[N, T]`` each); NaN for an empty group.

    For one group of examples (a split, or one kind of it), with pi_t, kappa and b_u of
    docs/concepts/objectives.md at the trial's alpha:

    - ``kappa_mean``, ``kappa_p10``, ``kappa_p50``, ``kappa_p90``; the same of 1/kappa
      (``inv_kappa_*``), the implicit example weight R~ gives an example relative to R_tok.
    - ``b_u``: the mean over examples of each example's token mean of b (c_base's definition,
      on this group).
    - ``pi_explained_share``: the mean over examples of
      ``sum_t pi_t (b_t - h_t) / sum_t pi_t b_t``, the share of the weight-averaged surprisal
      that the true strategy explains; ``pi_unexplained_share`` = ``sum_t pi_t h_t / sum_t
      pi_t b_t`` is its complement (the two sum to 1 per example). Per-token b - h can be
      negative (a token less likely under the true s than under the mixture), so a share can
      leave [0, 1] on a single example, rarely on a mean. Examples whose ``sum_t pi_t b_t`` is
      0 are left out. With ``base.kind: learned`` b_t is the learned model's and h_t the
      oracle's. Without an oracle (a registered dataset: ``cond_nll`` None) the two shares are
      absent: nothing knows h_t there.
    """
    b = base_nll.detach().double().cpu()
    mask = mask.cpu()
    stats = token_weight_stats(b, mask, alpha)
    active = stats.n_active > 0
    kappa = stats.kappa.double()[active]
    out = _quantile_stats(kappa, "kappa")
    out.update(_quantile_stats(1.0 / kappa, "inv_kappa"))
    out["b_u"] = float(stats.base_uniform.double()[active].mean()) if active.any() else math.nan
    if cond_nll is None:
        return out
    h = cond_nll.detach().double().cpu()
    weights = stats.weights.double()
    weighted_b = (weights * b).sum(-1)
    usable = active & (weighted_b > 0)
    explained = ((weights * (b - h)).sum(-1)[usable] / weighted_b[usable])
    share = float(explained.mean()) if usable.any() else math.nan
    out["pi_explained_share"] = share
    out["pi_unexplained_share"] = 1.0 - share
    return out


def by_kind(fn, kind: torch.Tensor, *tensors: torch.Tensor | None,
            kinds: tuple[str, ...] = KINDS, **kwargs) -> dict[str, float]:
    """``fn(*tensors, **kwargs)`` overall (``name``) and per kind present (``{kind}/name``);
    ``kinds`` names the kind codes (a dataset's groups; none: overall only). A None tensor
    is passed through as None."""
    out = dict(fn(*tensors, **kwargs))
    kind = kind.cpu()
    for index, name in enumerate(kinds):
        rows = kind == index
        if rows.any():
            subset = [None if t is None else t[rows.to(t.device)] for t in tensors]
            out.update({f"{name}/{k}": v for k, v in fn(*subset, **kwargs).items()})
    return out

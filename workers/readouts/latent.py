"""How much the latent knows about the true strategy s, and whether KL follows kappa.

I(z; s) in nats, always read beside the rate E[KL] (the gap is capacity spent on anything but
s): exact for the discrete family (:func:`discrete_mi_zs`), a mixture plug-in estimate for the
continuous one (:func:`gaussian_mixture_mi_zs`); and the rank correlation of per-example KL
with kappa (:func:`kl_kappa_spearman`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from workers.readouts.recovery import log_mixture, posterior_samples


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -torch.special.xlogy(p, p).sum()


def discrete_mi_zs(posterior_probs: torch.Tensor, strategy: torch.Tensor, num_strategies: int) -> float:
    """Plug-in I(z; s) of the q-averaged assignment; NaN when empty.

    The joint is ``P(z = k, s = j) = (1/N) sum_n q(k | x_n, y_n) [s_n = j]``, the channel from s
    to the q-averaged assignment: 0 when q ignores s, ``H(s)`` (log K for balanced s) when q is
    one-hot and a relabelling of s. No sampling, no bias beyond the empirical distribution.
    """
    q = posterior_probs.detach().double().cpu()
    if q.shape[0] == 0:
        return math.nan
    onehot = torch.nn.functional.one_hot(strategy.cpu().long(), num_strategies).double()
    joint = onehot.T @ q / q.shape[0]  # [K_s, K_z]
    mi = _entropy(joint.sum(1)) + _entropy(joint.sum(0)) - _entropy(joint)
    return max(float(mi), 0.0)


def gaussian_mixture_mi_zs(
    mean: torch.Tensor, logvar: torch.Tensor, strategy: torch.Tensor, seed: int = 0, *,
    sampled: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> float:
    """Mixture plug-in I(z; s) of a diagonal Gaussian posterior; NaN if empty.

    The aggregate posterior is the mixture of the N diagonal Gaussians q(z | x_n, y_n), the
    class-conditional one the mixture over the examples with that s. With one seeded sample
    ``z_n ~ q(z | x_n, y_n)`` per example, ``I ~= mean_n [log q(z_n | s_n) - log q(z_n)]`` (in
    the style of He et al. 2019's I(x; z)): at most the plug-in H(s), near 0 when the
    posteriors do not depend on s. ``sampled``: ``posterior_samples(mean, logvar, seed)`` when
    the caller already drew them.
    """
    mu, log_variance = mean.detach().double().cpu(), logvar.detach().double().cpu()
    if mu.shape[0] == 0:
        return math.nan
    strategy = strategy.cpu()
    samples, log_aggregate = sampled if sampled is not None else posterior_samples(mu, log_variance, seed)
    log_conditional = torch.empty_like(log_aggregate)
    for s in strategy.unique():
        rows = strategy == s
        log_conditional[rows] = log_mixture(samples[rows], mu[rows], log_variance[rows])
    return max(float((log_conditional - log_aggregate).mean()), 0.0)


def kl_kappa_spearman(kl: torch.Tensor, kappa: torch.Tensor) -> float:
    """Spearman rank correlation of per-example KL with kappa within a group; NaN where kappa is
    constant (alpha = 0 included: kappa = 1 for every example) or for fewer than 3 examples."""
    kl_np = kl.detach().double().cpu().numpy()
    kappa_np = kappa.detach().double().cpu().numpy()
    if kl_np.size < 3 or np.ptp(kappa_np) <= 1e-12 * max(1.0, float(np.abs(kappa_np).max())) or np.ptp(kl_np) == 0:
        return math.nan
    return _rank_correlation(kl_np, kappa_np)


def _rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho as Pearson's r of the average ranks, without spearmanr's per-call checks.
    pandas ranks, not scipy.stats: a trial worker already holds pandas (Ray Tune loads it), and
    scipy.stats would cost it about 0.7 s of import."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.corrcoef(_average_ranks(x), _average_ranks(y))[0, 1])


def _average_ranks(values: np.ndarray) -> np.ndarray:
    return pd.Series(values).rank(method="average").to_numpy()

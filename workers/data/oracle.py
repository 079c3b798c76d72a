"""Exact z-free base model of the synthetic task.

The oracle knows the generator but not the hidden strategy ``s``. At target
position ``t`` it marginalises ``s`` under its posterior given the context and
the target prefix seen so far::

    post_t(s) ∝ (1/K) * prod_{u<t} p(y_u | s, x, u)
    p(y_t | x, y_<t) = sum_s post_t(s) * p(y_t | s, x, t)

Per-strategy token likelihoods (``j = t - P`` is the body position)::

    prefix (t < P): p = 1/m if y_t lies in s's prefix block, else 0
    body  (t >= P): p = d/D * [y_t is distractor]
                      + (1 - d) * ((1 - n) * [y_t == f_s(x, j)] + n/V * [y_t is content])

Body length is not modelled (there is no EOS): the split's mask says which
positions exist, and every quantity here is 0 off the mask. All arithmetic is
float64 in log space.

Targets the generator cannot produce under any strategy (e.g. a split built
with a different config) give ``inf`` NLL and NaN posteriors from that
position on; splits from :func:`generate_split` with the same config never do.
"""

from __future__ import annotations

import math

import torch

from workers.data.synthetic import (
    CONTENT_START,
    SyntheticSplit,
    SyntheticTaskConfig,
    strategy_body_token,
)


def _check_split(config: SyntheticTaskConfig, split: SyntheticSplit) -> None:
    t_len = config.max_target_length
    if split.target.ndim != 2 or split.target.shape[1] != t_len:
        raise ValueError(
            f"target must have shape [N, {t_len}] (max_target_length), got "
            f"{tuple(split.target.shape)}"
        )
    if split.mask.shape != split.target.shape:
        raise ValueError("mask and target shapes differ")


def _body_rule_tokens(config: SyntheticTaskConfig, split: SyntheticSplit) -> torch.Tensor:
    """``f_s(x, j)`` for every strategy and body position: ``[N, K, body_length_max]``."""
    k = config.num_strategies
    device = split.context.device
    s = torch.arange(k, device=device).view(1, k, 1)
    j = torch.arange(config.body_length_max, device=device).view(1, 1, -1)
    out = strategy_body_token(config, s, split.context[:, None, None, :], j)
    assert isinstance(out, torch.Tensor)  # tensor context in, tensor out
    return out


def oracle_token_log_likelihood(config: SyntheticTaskConfig, split: SyntheticSplit) -> torch.Tensor:
    """Per-strategy log-likelihood ``log p(y_t | s, x, t)``.

    Args:
        config: The config the split was generated with.
        split: Split to score.

    Returns:
        float64 ``[N, K, T]``; ``-inf`` where ``s`` cannot emit ``y_t`` (e.g. a
        prefix token outside ``s``'s block, or a token other than ``f_s`` when
        ``noise_rate`` and ``distractor_rate`` are 0); exactly 0 off the mask.
    """
    _check_split(config, split)
    k = config.num_strategies
    m = config.prefix_tokens_per_strategy
    p = config.prefix_length
    v = config.content_vocab
    d = config.distractor_rate
    n = config.noise_rate
    device = split.target.device
    f64 = torch.float64

    y = split.target
    y_pre = y[:, None, :p]
    block_lo = config.prefix_token_start + m * torch.arange(k, device=device).view(1, k, 1)
    in_block = (y_pre >= block_lo) & (y_pre < block_lo + m)
    ll_pre = torch.where(
        in_block,
        torch.tensor(-math.log(m), dtype=f64, device=device),
        torch.tensor(-math.inf, dtype=f64, device=device),
    )

    y_body = y[:, None, p:]
    is_distractor = (y_body >= config.distractor_token_start) & (y_body < config.vocab_size)
    is_content = (y_body >= CONTENT_START) & (y_body < CONTENT_START + v)
    matches_rule = y_body == _body_rule_tokens(config, split)
    # Summing the mixture components before the log keeps the case where a
    # uniform noise token coincides with f_s exact.
    prob_body = (
        (d / config.num_distractor_tokens) * is_distractor.to(f64)
        + (1.0 - d) * (1.0 - n) * matches_rule.to(f64)
        + (1.0 - d) * (n / v) * is_content.to(f64)
    )
    ll_body = torch.log(prob_body)

    ll = torch.cat([ll_pre, ll_body], dim=2)
    return torch.where(split.mask[:, None, :], ll, torch.zeros((), dtype=f64, device=device))


def _cumulative(ll: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exclusive and inclusive cumulative log-likelihoods along T, ``[N, K, T]`` each."""
    incl = torch.cumsum(ll, dim=2)
    # Shifting instead of ``incl - ll`` avoids ``-inf - -inf = nan`` once a
    # strategy has been ruled out.
    excl = torch.cat([torch.zeros_like(incl[:, :, :1]), incl[:, :, :-1]], dim=2)
    return excl, incl


def oracle_strategy_posterior(config: SyntheticTaskConfig, split: SyntheticSplit) -> torch.Tensor:
    """Posterior over strategies before seeing ``y_t``: ``p(s | x, y_<t)``.

    Returns:
        float64 ``[N, T, K]`` probabilities summing to 1 over K. Position 0 is
        uniform. Off the mask the posterior stays at its value after the last
        active token (off-mask tokens carry no evidence).
    """
    excl, _ = _cumulative(oracle_token_log_likelihood(config, split))
    log_post = excl - torch.logsumexp(excl, dim=1, keepdim=True)
    return log_post.exp().permute(0, 2, 1).contiguous()


def oracle_base_nll(
    config: SyntheticTaskConfig,
    split: SyntheticSplit,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-token oracle surprisal ``b_t = -log p(y_t | x, y_<t)``.

    Computed as ``logsumexp_s(incl_t) - logsumexp_s(excl_t)`` of the cumulative
    per-strategy log-likelihoods, which equals the posterior-weighted mixture
    without forming probabilities.

    Args:
        config: The config the split was generated with.
        split: Split to score.
        dtype: Output dtype; arithmetic is float64 regardless.

    Returns:
        ``[N, T]`` non-negative surprisals, 0 off the mask.
    """
    excl, incl = _cumulative(oracle_token_log_likelihood(config, split))
    b = torch.logsumexp(excl, dim=1) - torch.logsumexp(incl, dim=1)
    b = torch.where(split.mask, b, torch.zeros_like(b))
    return b.to(dtype)


def oracle_predictive(config: SyntheticTaskConfig, split: SyntheticSplit) -> torch.Tensor:
    """Full predictive distribution ``p(. | x, y_<t)`` over the vocabulary.

    Materialises ``[N, K, T, V]`` floats, so it is meant for small splits
    (tests, inspection), not for training-sized data.

    Returns:
        float64 ``[N, T, vocab_size]``; each on-mask row sums to 1, off-mask
        rows are all 0. PAD, BOS and (at body positions) prefix tokens get 0.
    """
    _check_split(config, split)
    k = config.num_strategies
    m = config.prefix_tokens_per_strategy
    p = config.prefix_length
    v = config.content_vocab
    d = config.distractor_rate
    n = config.noise_rate
    n_ex = len(split)
    device = split.target.device
    f64 = torch.float64

    q = torch.zeros(n_ex, k, config.max_target_length, config.vocab_size, dtype=f64, device=device)
    for s in range(k):
        lo = config.prefix_token_start + s * m
        q[:, s, :p, lo : lo + m] = 1.0 / m
    q[:, :, p:, config.distractor_token_start :] = d / config.num_distractor_tokens
    q[:, :, p:, CONTENT_START : CONTENT_START + v] = (1.0 - d) * n / v
    rule = _body_rule_tokens(config, split)
    q[:, :, p:, :].scatter_add_(
        3,
        rule[..., None],
        torch.full(rule.shape + (1,), (1.0 - d) * (1.0 - n), dtype=f64, device=device),
    )

    post = oracle_strategy_posterior(config, split)
    pred = torch.einsum("ntk,nktv->ntv", post, q)
    return pred * split.mask[..., None].to(f64)

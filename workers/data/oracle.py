"""The exact z-free base model of the synthetic task: the generator known, the strategy not.

At each target position the oracle marginalises the hidden strategy under its posterior given
the context and the target so far (:func:`oracle_base_nll` gives the formulas); the example's
kind is observed. :func:`oracle_conditional_nll` is the NLL given the true strategy, h_t. All
arithmetic is float64 in log space, and every quantity is 0 off the split's mask.
"""

from __future__ import annotations

import math

import torch

from workers.data.config import KINDS, SyntheticTaskConfig
from workers.data.synthetic import (
    CONTENT_START,
    SyntheticSplit,
    kind_layout,
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


def _layout(config: SyntheticTaskConfig, split: SyntheticSplit):
    """Per-position ``(is_prefix [N,1,T], noise [N,1,1], j [N,1,T])`` from the examples' kinds."""
    offset, noise = kind_layout(config, split.kind)
    t = torch.arange(config.max_target_length, device=split.target.device).view(1, -1)
    is_prefix = t < offset[:, None]
    j = (t - offset[:, None]).clamp_min(0)
    return is_prefix[:, None, :], noise.view(-1, 1, 1), j[:, None, :]


def _body_rule_tokens(config: SyntheticTaskConfig, split: SyntheticSplit, j: torch.Tensor) -> torch.Tensor:
    """``f_s(x, j)`` for every strategy and target position: ``[N, K, T]``."""
    k = config.num_strategies
    s = torch.arange(k, device=split.context.device).view(1, k, 1)
    context = split.content_context(config)
    out = strategy_body_token(config, s, context[:, None, None, :], j)
    assert isinstance(out, torch.Tensor)  # tensor context in, tensor out
    return out


def oracle_token_log_likelihood(config: SyntheticTaskConfig, split: SyntheticSplit) -> torch.Tensor:
    """Per-strategy log-likelihood ``log p(y_t | s, x, t)`` (the example's kind is known from x).

    Args:
        config: The config the split was generated with.
        split: Split to score.

    Returns:
        float64 ``[N, K, T]``; ``-inf`` where ``s`` cannot emit ``y_t`` (e.g. a
        prefix token outside ``s``'s block, or a token other than ``f_s`` when
        the noise and ``distractor_rate`` are 0); exactly 0 off the mask. A private
        prefix token gets ``-log M`` under every ``s`` (s does not explain it).
    """
    _check_split(config, split)
    k = config.num_strategies
    m = config.prefix_tokens_per_strategy
    v = config.content_vocab
    d = config.distractor_rate
    device = split.target.device
    f64 = torch.float64
    neg_inf = torch.tensor(-math.inf, dtype=f64, device=device)

    y = split.target[:, None, :]
    is_prefix, n, j = _layout(config, split)
    block_lo = config.prefix_token_start + m * torch.arange(k, device=device).view(1, k, 1)
    in_block = (y >= block_lo) & (y < block_lo + m)
    ll_strategy_prefix = torch.where(in_block, torch.tensor(-math.log(m), dtype=f64, device=device),
                                     neg_inf)
    first = (torch.arange(y.shape[-1], device=device) == 0).view(1, 1, -1)
    lo = torch.where(first, config.private_token_start, config.private_tail_start)
    size = torch.where(first, max(config.resolved_private_prefix_tokens, 1), m)
    ll_private = torch.where((y >= lo) & (y < lo + size), -torch.log(size.to(f64)), neg_inf)
    private = (split.kind == KINDS.index("private")).view(-1, 1, 1)
    ll_pre = torch.where(private, ll_private, ll_strategy_prefix)

    is_distractor = (y >= config.distractor_token_start) & (y < config.private_token_start)
    is_content = (y >= CONTENT_START) & (y < CONTENT_START + v)
    matches_rule = y == _body_rule_tokens(config, split, j)
    # Summing the mixture components before the log keeps the case where a
    # uniform noise token coincides with f_s exact.
    prob_body = (
        (d / config.num_distractor_tokens) * is_distractor.to(f64)
        + (1.0 - d) * (1.0 - n) * matches_rule.to(f64)
        + (1.0 - d) * (n / v) * is_content.to(f64)
    )
    ll = torch.where(is_prefix, ll_pre, torch.log(prob_body))
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

    The oracle knows the generator but not the hidden strategy ``s``. At target
    position ``t`` it marginalises ``s`` under its posterior given the context and
    the target prefix seen so far::

        post_t(s) ∝ (1/K) * prod_{u<t} p(y_u | s, x, u)
        p(y_t | x, y_<t) = sum_s post_t(s) * p(y_t | s, x, t)

    Per-strategy token likelihoods (``P_k`` = the kind's prefix length, P or 0 for
    ``diffuse``; ``j = t - P_k`` the body position; ``n`` the kind's body noise)::

        prefix kind, t < P:  p = 1/m if y_t lies in s's prefix block, else 0
        private kind, t < P: p = 1/M if y_t lies in the private block, else 0 (the same for every s)
        body (t >= P_k):     p = d/D * [y_t is distractor]
                               + (1 - d) * ((1 - n) * [y_t == f_s(x, j)] + n/V * [y_t is content])

    The kind is read from the split (in the mixed task it is the context's marker token, so
    it is observed); only s is marginalised. :func:`oracle_conditional_nll` gives the NLL
    given the true s, ``h_t``.

    Body length is not modelled (there is no EOS): the split's mask says which
    positions exist, and every quantity here is 0 off the mask. All arithmetic is
    float64 in log space.

    Targets the generator cannot produce under any strategy (e.g. a split built
    with a different config) give ``inf`` NLL and NaN posteriors from that
    position on; splits from :func:`generate_split` with the same config never do.

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


def oracle_conditional_nll(
    config: SyntheticTaskConfig,
    split: SyntheticSplit,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-token NLL given the true strategy: ``h_t = -log p(y_t | s, x, y_<t)``.

    Tokens are independent given ``s`` and ``x``, so this is ``-log p(y_t | s, x, t)``.
    ``b_t - h_t`` is the strategy-explained surprisal of a token (its expectation is the
    information y_t carries about s); ``h_t`` is what s leaves unexplained.

    Returns:
        ``[N, T]``, 0 off the mask.
    """
    ll = oracle_token_log_likelihood(config, split)
    h = -ll[torch.arange(len(split), device=ll.device), split.strategy]
    return torch.where(split.mask, h, torch.zeros_like(h)).to(dtype)


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
    v = config.content_vocab
    d = config.distractor_rate
    device = split.target.device
    f64 = torch.float64

    is_prefix, noise, j = _layout(config, split)
    is_prefix, noise = is_prefix[..., None], noise[..., None]  # [N,1,T,1], [N,1,1,1]
    shape = (len(split), k, config.max_target_length, config.vocab_size)
    prefix_q = torch.zeros(shape[1:], dtype=f64, device=device)
    for s in range(k):
        lo = config.prefix_token_start + s * m
        prefix_q[s, :, lo : lo + m] = 1.0 / m
    private_q = torch.zeros(shape[1:], dtype=f64, device=device)
    size = config.resolved_private_prefix_tokens
    private_q[:, 0, config.private_token_start : config.private_token_start + size] = (
        1.0 / max(size, 1))
    private_q[:, 1:, config.private_tail_start : config.private_tail_start + m] = 1.0 / m
    private = (split.kind == KINDS.index("private")).view(-1, 1, 1, 1)
    body_q = torch.zeros(shape, dtype=f64, device=device)
    body_q[..., config.distractor_token_start : config.private_token_start] = (
        d / config.num_distractor_tokens)
    body_q[..., CONTENT_START : CONTENT_START + v] = (1.0 - d) * noise / v
    rule = _body_rule_tokens(config, split, j)
    body_q.scatter_add_(3, rule[..., None], ((1.0 - d) * (1.0 - noise)).expand(rule.shape + (1,)))
    q = torch.where(is_prefix, torch.where(private, private_q, prefix_q), body_q)

    post = oracle_strategy_posterior(config, split)
    pred = torch.einsum("ntk,nktv->ntv", post, q)
    return pred * split.mask[..., None].to(f64)

"""Tests for the synthetic task generator and the exact oracle base model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from workers.data import (
    BOS_ID,
    PAD_ID,
    SyntheticTaskConfig,
    generate_split,
    generate_task,
    oracle_base_nll,
    oracle_predictive,
    oracle_strategy_posterior,
    oracle_token_log_likelihood,
    strategy_body_token,
    strategy_constants,
)

TINY = SyntheticTaskConfig(
    content_vocab=3,
    num_strategies=3,
    context_length=2,
    prefix_length=2,
    prefix_tokens_per_strategy=2,
    body_length_min=1,
    body_length_max=3,
    noise_rate=0.2,
    distractor_rate=0.1,
    num_distractor_tokens=2,
    train_size=40,
    val_size=40,
    seed=3,
)


def _splits_equal(a, b) -> bool:
    return all(
        torch.equal(getattr(a, f), getattr(b, f)) for f in ("context", "target", "mask", "strategy", "kind")
    )


# --------------------------------------------------------------------------- config


def test_config_defaults_and_derived_sizes() -> None:
    c = SyntheticTaskConfig()
    assert c.vocab_size == 2 + 16 + 4 * 4 + 4 == 38
    assert c.prefix_token_start == 18
    assert c.distractor_token_start == 34
    assert c.max_target_length == 2 + 10


def test_config_rejects_inverted_body_lengths() -> None:
    with pytest.raises(ValidationError) as exc:
        SyntheticTaskConfig(body_length_min=5, body_length_max=4)
    msg = str(exc.value)
    assert "body_length_max" in msg and "body_length_min" in msg


def test_config_rejects_extra_and_out_of_range_fields() -> None:
    with pytest.raises(ValidationError):
        SyntheticTaskConfig(not_a_field=1)
    with pytest.raises(ValidationError):
        SyntheticTaskConfig(noise_rate=1.0)
    with pytest.raises(ValidationError):
        SyntheticTaskConfig(num_strategies=1)
    with pytest.raises(ValidationError):
        SyntheticTaskConfig(content_vocab=1)


def test_config_is_frozen() -> None:
    c = SyntheticTaskConfig()
    with pytest.raises(ValidationError):
        c.seed = 5  # type: ignore[misc]


# --------------------------------------------------------------------------- generator


def test_generation_is_deterministic_and_seed_dependent() -> None:
    c = SyntheticTaskConfig(train_size=300, val_size=200)
    tr1, va1 = generate_task(c)
    tr2, va2 = generate_task(c)
    assert _splits_equal(tr1, tr2) and _splits_equal(va1, va2)
    # Each split depends on the config only, not on generation order.
    assert _splits_equal(generate_split(c, "val"), va1)

    tr3 = generate_split(c.model_copy(update={"seed": 1}), "train")
    assert not torch.equal(tr1.target, tr3.target)
    assert not torch.equal(tr1.target[:200], va1.target)
    assert not torch.equal(tr1.context[:200], va1.context)


def test_generate_split_rejects_unknown_split() -> None:
    with pytest.raises(ValueError, match="split"):
        generate_split(SyntheticTaskConfig(), "bogus")  # type: ignore[arg-type]


def test_shapes_dtypes_mask_and_token_regions() -> None:
    c = SyntheticTaskConfig(train_size=2000, val_size=10, distractor_rate=0.2, noise_rate=0.1)
    tr = generate_split(c, "train")
    n, t_len, p, m = 2000, c.max_target_length, c.prefix_length, c.prefix_tokens_per_strategy
    assert len(tr) == n
    assert tr.context.shape == (n, c.context_length) and tr.context.dtype == torch.int64
    assert tr.target.shape == (n, t_len) and tr.target.dtype == torch.int64
    assert tr.mask.shape == (n, t_len) and tr.mask.dtype == torch.bool
    assert tr.strategy.shape == (n,) and tr.strategy.dtype == torch.int64

    assert ((tr.context >= 2) & (tr.context < 2 + c.content_vocab)).all()
    assert ((tr.strategy >= 0) & (tr.strategy < c.num_strategies)).all()

    # Mask is a leading contiguous run of length P + L.
    lengths = tr.mask.sum(1)
    assert (lengths >= p + c.body_length_min).all() and (lengths <= p + c.body_length_max).all()
    expected_mask = torch.arange(t_len)[None, :] < lengths[:, None]
    assert torch.equal(tr.mask, expected_mask)
    assert set(lengths.unique().tolist()) == set(range(p + 6, p + 11))
    assert (tr.target[~tr.mask] == PAD_ID).all()

    lo = c.prefix_token_start + tr.strategy[:, None] * m
    prefix = tr.target[:, :p]
    assert ((prefix >= lo) & (prefix < lo + m)).all()

    body = tr.target[:, p:][tr.mask[:, p:]]
    is_content = (body >= 2) & (body < 2 + c.content_vocab)
    is_distractor = (body >= c.distractor_token_start) & (body < c.vocab_size)
    assert (is_content | is_distractor).all()
    assert is_distractor.any()


def test_noiseless_body_equals_strategy_rule() -> None:
    c = SyntheticTaskConfig(noise_rate=0.0, distractor_rate=0.0, train_size=500)
    tr = generate_split(c, "train")
    j = torch.arange(c.body_length_max)
    rule = strategy_body_token(c, tr.strategy[:, None], tr.context[:, None, :], j[None, :])
    assert isinstance(rule, torch.Tensor) and rule.shape == (500, c.body_length_max)
    body_mask = tr.mask[:, c.prefix_length :]
    assert torch.equal(tr.target[:, c.prefix_length :][body_mask], rule[body_mask])

    # Hand-computed: f_s(x, j) = 2 + (a_s (x[j mod C] - 2) + c_s + j) mod V.
    a, cc = strategy_constants(c)
    i = 7
    s = int(tr.strategy[i])
    for jj in range(int(body_mask[i].sum())):
        x = int(tr.context[i, jj % c.context_length])
        want = 2 + (int(a[s]) * (x - 2) + int(cc[s]) + jj) % c.content_vocab
        assert int(tr.target[i, c.prefix_length + jj]) == want


def test_strategy_rules_differ_for_default_config() -> None:
    c = SyntheticTaskConfig()
    a, cc = strategy_constants(c)
    assert np.all((a >= 1) & (a < c.content_vocab))
    ctx = np.arange(2, 2 + c.content_vocab).reshape(-1, 1).repeat(c.context_length, axis=1)
    j = np.arange(c.body_length_max)
    s = np.arange(c.num_strategies)
    f = strategy_body_token(c, s[:, None, None], ctx[None, :, None, :], j[None, None, :])
    assert isinstance(f, np.ndarray) and f.shape == (4, c.content_vocab, c.body_length_max)
    # Every pair of strategies disagrees at every (x, j) for the defaults.
    for r in range(4):
        for q in range(r + 1, 4):
            assert np.all(f[r] != f[q])


def test_strategy_body_token_validates_inputs() -> None:
    c = SyntheticTaskConfig()
    with pytest.raises(ValueError, match="context_length"):
        strategy_body_token(c, 0, np.zeros((3, 5), dtype=np.int64) + 2, 0)
    with pytest.raises(ValueError, match="strategy"):
        strategy_body_token(c, 4, np.zeros((6,), dtype=np.int64) + 2, 0)


def test_split_helpers() -> None:
    c = SyntheticTaskConfig(train_size=50)
    tr = generate_split(c, "train")
    dec = tr.decoder_input()
    assert dec.shape == tr.target.shape
    assert (dec[:, 0] == BOS_ID).all()
    assert torch.equal(dec[:, 1:], tr.target[:, :-1])

    idx = [3, 0, 7]
    sub = tr.subset(idx)
    assert len(sub) == 3
    assert torch.equal(sub.target, tr.target[idx]) and torch.equal(sub.strategy, tr.strategy[idx])
    assert _splits_equal(tr.subset(np.array(idx)), sub)
    assert _splits_equal(tr.subset(torch.tensor(idx)), sub)
    assert len(tr.subset(slice(10, 20))) == 10
    assert _splits_equal(tr.to("cpu"), tr)


def test_statistics_match_config() -> None:
    c = SyntheticTaskConfig(
        train_size=40_000, num_strategies=5, noise_rate=0.1, distractor_rate=0.05
    )
    tr = generate_split(c, "train")
    n = len(tr)
    freq = torch.bincount(tr.strategy, minlength=5).double() / n
    # 5 standard errors of a binomial proportion.
    assert torch.all((freq - 0.2).abs() < 5 * math.sqrt(0.2 * 0.8 / n))

    p = c.prefix_length
    j = torch.arange(c.body_length_max)
    rule = strategy_body_token(c, tr.strategy[:, None], tr.context[:, None, :], j[None, :])
    body_mask = tr.mask[:, p:]
    body = tr.target[:, p:][body_mask]
    rule = rule[body_mask]
    is_distractor = body >= c.distractor_token_start
    n_body = body.numel()
    d_hat = is_distractor.double().mean().item()
    assert abs(d_hat - 0.05) < 5 * math.sqrt(0.05 * 0.95 / n_body)

    # A noise draw coincides with f_s with prob 1/V, so the visible mismatch
    # rate among non-distractor tokens is noise_rate * (1 - 1/V).
    nd = ~is_distractor
    mismatch = (body[nd] != rule[nd]).double().mean().item()
    expected = 0.1 * (1 - 1 / c.content_vocab)
    assert abs(mismatch - expected) < 5 * math.sqrt(expected * (1 - expected) / int(nd.sum()))


def test_generation_scales_to_100k() -> None:
    # No timing assert here (timings belong in benchmarks/): a large split is generated whole.
    c = SyntheticTaskConfig(train_size=100_000)
    tr = generate_split(c, "train")
    assert len(tr) == 100_000 and tr.mask.any(dim=-1).all()


# --------------------------------------------------------------------------- oracle


def _brute_token_prob(c: SyntheticTaskConfig, s: int, x: list[int], t: int, tok: int) -> float:
    """p(y_t = tok | s, x) written out from the generative story, without vectorisation."""
    p, m, v = c.prefix_length, c.prefix_tokens_per_strategy, c.content_vocab
    if t < p:
        lo = 2 + v + s * m
        return 1.0 / m if lo <= tok < lo + m else 0.0
    j = t - p
    a_s = 1 + (2 * s) % (v - 1)
    c_s = s % v
    rule = 2 + (a_s * (x[j % c.context_length] - 2) + c_s + j) % v
    d_lo = 2 + v + c.num_strategies * m
    prob = 0.0
    if d_lo <= tok < d_lo + c.num_distractor_tokens:
        prob += c.distractor_rate / c.num_distractor_tokens
    if 2 <= tok < 2 + v:
        prob += (1 - c.distractor_rate) * c.noise_rate / v
    if tok == rule:
        prob += (1 - c.distractor_rate) * (1 - c.noise_rate)
    return prob


def _brute_joint(c: SyntheticTaskConfig, x: list[int], y: list[int]) -> float:
    """P(y | x) = sum_s (1/K) prod_u p(y_u | s, x, u)."""
    total = 0.0
    for s in range(c.num_strategies):
        prod = 1.0 / c.num_strategies
        for u, tok in enumerate(y):
            prod *= _brute_token_prob(c, s, x, u, tok)
        total += prod
    return total


@pytest.mark.parametrize("k", [2, 3])
def test_oracle_matches_brute_force(k: int) -> None:
    c = TINY.model_copy(update={"num_strategies": k})
    va = generate_split(c, "val")
    b = oracle_base_nll(c, va, dtype=torch.float64)
    assert b.dtype == torch.float64
    for i in range(len(va)):
        x = va.context[i].tolist()
        length = int(va.mask[i].sum())
        y = va.target[i, :length].tolist()
        for t in range(length):
            want = -math.log(_brute_joint(c, x, y[: t + 1]) / _brute_joint(c, x, y[:t]))
            assert b[i, t].item() == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert (b[i, length:] == 0).all()

    # Posterior before y_t matches Bayes' rule on the brute-force joint.
    post = oracle_strategy_posterior(c, va)
    i = 0
    x, y = va.context[i].tolist(), va.target[i].tolist()
    for t in range(int(va.mask[i].sum())):
        w = []
        for s in range(k):
            prod = 1.0
            for u in range(t):
                prod *= _brute_token_prob(c, s, x, u, y[u])
            w.append(prod)
        z = sum(w)
        for s in range(k):
            assert post[i, t, s].item() == pytest.approx(w[s] / z, rel=1e-9)


def test_oracle_token_log_likelihood_shape_and_off_mask() -> None:
    va = generate_split(TINY, "val")
    ll = oracle_token_log_likelihood(TINY, va)
    assert ll.shape == (len(va), TINY.num_strategies, TINY.max_target_length)
    assert ll.dtype == torch.float64
    assert (ll[~va.mask[:, None, :].expand_as(ll)] == 0).all()
    # The true strategy always explains the data.
    true_ll = ll[torch.arange(len(va)), va.strategy]
    assert torch.isfinite(true_ll).all()
    # Other strategies cannot emit the first prefix token.
    other = (va.strategy + 1) % TINY.num_strategies
    assert torch.isneginf(ll[torch.arange(len(va)), other, 0]).all()


def test_oracle_predictive_normalised_and_consistent_with_nll() -> None:
    va = generate_split(TINY, "val")
    pred = oracle_predictive(TINY, va)
    assert pred.shape == (len(va), TINY.max_target_length, TINY.vocab_size)
    sums = pred.sum(-1)
    torch.testing.assert_close(sums[va.mask], torch.ones_like(sums[va.mask]), rtol=0, atol=1e-12)
    assert (sums[~va.mask] == 0).all()
    assert (pred[..., PAD_ID] == 0).all() and (pred[..., BOS_ID] == 0).all()
    b = oracle_base_nll(TINY, va, dtype=torch.float64)
    p_y = pred.gather(2, va.target[..., None])[..., 0]
    torch.testing.assert_close(-torch.log(p_y[va.mask]), b[va.mask], rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(
    k=st.integers(2, 4),
    v=st.integers(2, 5),
    m=st.integers(1, 3),
    p=st.integers(1, 3),
    noise=st.sampled_from([0.0, 0.1, 0.5]),
    distract=st.sampled_from([0.0, 0.2]),
    seed=st.integers(0, 1000),
)
def test_oracle_properties_random_configs(
    k: int, v: int, m: int, p: int, noise: float, distract: float, seed: int
) -> None:
    c = SyntheticTaskConfig(
        content_vocab=v,
        num_strategies=k,
        context_length=3,
        prefix_length=p,
        prefix_tokens_per_strategy=m,
        body_length_min=1,
        body_length_max=4,
        noise_rate=noise,
        distractor_rate=distract,
        num_distractor_tokens=2,
        train_size=8,
        val_size=8,
        seed=seed,
    )
    va = generate_split(c, "val")
    b = oracle_base_nll(c, va, dtype=torch.float64)
    assert torch.isfinite(b).all() and (b >= -1e-12).all()
    # First token: uniform over all K*m prefix tokens.
    torch.testing.assert_close(b[:, 0], torch.full_like(b[:, 0], math.log(k * m)))
    pred = oracle_predictive(c, va)
    sums = pred.sum(-1)[va.mask]
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-12)
    post = oracle_strategy_posterior(c, va)
    torch.testing.assert_close(post.sum(-1), torch.ones_like(post[..., 0]))


def test_oracle_prefix_heavy_surprisal() -> None:
    c = SyntheticTaskConfig(
        prefix_length=3,
        num_strategies=8,
        prefix_tokens_per_strategy=8,
        noise_rate=0.02,
        distractor_rate=0.0,
        train_size=10,
        val_size=2000,
    )
    va = generate_split(c, "val")
    b = oracle_base_nll(c, va)
    assert b.dtype == torch.float32
    p = c.prefix_length
    prefix_mean = b[:, :p].mean().item()
    body_b = b[:, p:][va.mask[:, p:]]
    body_mean = body_b.mean().item()
    assert prefix_mean / body_mean > 5
    torch.testing.assert_close(b[:, 0], torch.full_like(b[:, 0], math.log(64)), rtol=1e-6, atol=0)
    # After the first prefix token s is known, so later prefix tokens cost log m.
    torch.testing.assert_close(
        b[:, 1:p], torch.full_like(b[:, 1:p], math.log(8)), rtol=1e-6, atol=0
    )
    assert (b[~va.mask] == 0).all()

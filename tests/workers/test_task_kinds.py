"""The mixed task: example kinds, the exact oracle (b_t and h_t) for each, kappa matching, seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workers.data import (
    KINDS,
    KindProportions,
    SyntheticTaskConfig,
    generate_split,
    generate_splits,
    oracle_base_nll,
    oracle_conditional_nll,
    oracle_predictive,
)
from workers.data.calibration import kappa_by_kind

MIXED = KindProportions(prefix=1.0, diffuse=1.0, private=1.0)
TINY = SyntheticTaskConfig(
    content_vocab=3, num_strategies=3, context_length=2, prefix_length=2,
    prefix_tokens_per_strategy=2, body_length_min=1, body_length_max=3, noise_rate=0.2,
    diffuse_noise_rate=0.6, distractor_rate=0.1, num_distractor_tokens=2,
    kind_proportions=MIXED, private_prefix_tokens=5, train_size=30, val_size=60, seed=3,
)


def _token_prob(c: SyntheticTaskConfig, kind: int, s: int, x: list[int], t: int, tok: int) -> float:
    """p(y_t = tok | s, kind, x) written out from the generative story, one token at a time."""
    p, m, v = c.prefix_length, c.prefix_tokens_per_strategy, c.content_vocab
    offset = 0 if KINDS[kind] == "diffuse" else p
    if t < offset and KINDS[kind] == "prefix":
        lo = 2 + v + s * m
        return 1.0 / m if lo <= tok < lo + m else 0.0
    if t < offset:  # private: first token from the private block, the others from the tail
        lo, size = (c.private_token_start, c.private_prefix_tokens) if t == 0 else (
            c.private_token_start + c.private_prefix_tokens, m)
        return 1.0 / size if lo <= tok < lo + size else 0.0
    noise = c.noise_rate if KINDS[kind] == "prefix" else (
        c.diffuse_noise_rate if KINDS[kind] == "diffuse" else c.noise_rate)
    j = t - offset
    rule = 2 + ((1 + (2 * s) % (v - 1)) * (x[j % c.context_length] - 2) + s % v + j) % v
    d_lo = 2 + v + c.num_strategies * m
    prob = c.distractor_rate / c.num_distractor_tokens if d_lo <= tok < d_lo + 2 else 0.0
    if 2 <= tok < 2 + v:
        prob += (1 - c.distractor_rate) * noise / v
    if tok == rule:
        prob += (1 - c.distractor_rate) * (1 - noise)
    return prob


def _joint(c, kind, x, y, strategies) -> float:
    total = 0.0
    for s in strategies:
        prod = 1.0 / len(strategies)
        for u, tok in enumerate(y):
            prod *= _token_prob(c, kind, s, x, u, tok)
        total += prod
    return total


def test_oracle_b_and_h_match_brute_force_enumeration_for_every_kind() -> None:
    split = generate_split(TINY, "val")
    assert set(split.kind.tolist()) == {0, 1, 2}
    b = oracle_base_nll(TINY, split, dtype=torch.float64)
    h = oracle_conditional_nll(TINY, split, dtype=torch.float64)
    k = range(TINY.num_strategies)
    for i in range(len(split)):
        x, kind = split.context[i, : TINY.context_length].tolist(), int(split.kind[i])
        assert int(split.context[i, -1]) == TINY.kind_token_start + kind  # the marker
        length, s = int(split.mask[i].sum()), int(split.strategy[i])
        y = split.target[i, :length].tolist()
        for t in range(length):
            want_b = -math.log(_joint(TINY, kind, x, y[: t + 1], k) / _joint(TINY, kind, x, y[:t], k))
            want_h = -math.log(_token_prob(TINY, kind, s, x, t, y[t]))
            assert b[i, t].item() == pytest.approx(want_b, rel=1e-9, abs=1e-12)
            assert h[i, t].item() == pytest.approx(want_h, rel=1e-9, abs=1e-12)
        assert (b[i, length:] == 0).all() and (h[i, length:] == 0).all()


def test_predictive_is_normalised_and_agrees_with_b() -> None:
    split = generate_split(TINY, "val")
    pred = oracle_predictive(TINY, split)
    sums = pred.sum(-1)[split.mask]
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-12)
    b = oracle_base_nll(TINY, split, dtype=torch.float64)
    p_y = pred.gather(2, split.target[..., None])[..., 0]
    torch.testing.assert_close(-torch.log(p_y[split.mask]), b[split.mask], rtol=1e-12, atol=1e-12)


def test_where_the_strategy_explains_surprisal_differs_by_kind() -> None:
    c = SyntheticTaskConfig(kind_proportions=MIXED, val_size=3000)
    split = generate_split(c, "val")
    b = oracle_base_nll(c, split, dtype=torch.float64)
    explained = b - oracle_conditional_nll(c, split, dtype=torch.float64)
    prefix, diffuse, private = (split.kind == i for i in range(3))
    # prefix: the first token carries log K of strategy information, nothing after it.
    torch.testing.assert_close(explained[prefix, 0], torch.full_like(explained[prefix, 0], math.log(4)))
    assert explained[prefix, 1:].abs().max() < 1e-9
    # private: the prefix is all unexplained surprisal (b = h = log M, then log m).
    assert explained[private, :2].abs().max() < 1e-9
    torch.testing.assert_close(b[private, 0], torch.full_like(b[private, 0],
                                                             math.log(c.resolved_private_prefix_tokens)))
    # every kind's strategy-explained surprisal sums to about log K (the information in y).
    for rows in (prefix, diffuse, private):
        total = (explained[rows] * split.mask[rows]).sum(-1).mean().item()
        assert 0.5 * math.log(4) < total <= math.log(4) + 1e-6, total
    # diffuse: spread over the body (no single position holds most of it).
    per_position = (explained[diffuse] * split.mask[diffuse]).sum(0)
    assert per_position.max() / per_position.sum() < 0.25


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_private_kappa_matches_prefix_kappa(alpha: float) -> None:
    """Stated tolerance: medians within 10%, p10 and p90 within 20% (fresh sample, not the
    calibration one); diffuse examples far below both."""
    c = SyntheticTaskConfig(kind_proportions=MIXED, val_size=6000, seed=7)
    split = generate_split(c, "val")
    kappa = kappa_by_kind(oracle_base_nll(c, split, dtype=torch.float64), split.mask, split.kind, alpha)
    for q, tolerance in ((0.5, 0.10), (0.1, 0.20), (0.9, 0.20)):
        prefix, private = kappa[0].quantile(q).item(), kappa[2].quantile(q).item()
        assert abs(private / prefix - 1) < tolerance, (q, prefix, private)
    assert kappa[1].quantile(0.9) < 0.5 * kappa[0].quantile(0.1)


def test_kind_proportions_are_respected_and_stored() -> None:
    c = SyntheticTaskConfig(kind_proportions=KindProportions(prefix=2, diffuse=1, private=1),
                            train_size=20_000)
    split = generate_split(c, "train")
    freq = torch.bincount(split.kind, minlength=3).double() / len(split)
    for got, want in zip(freq.tolist(), (0.5, 0.25, 0.25), strict=True):
        assert abs(got - want) < 5 * math.sqrt(want * (1 - want) / len(split))
    assert split.context.shape[1] == c.context_length + 1 == c.input_context_length
    assert split.target.max() < c.vocab_size


def test_legacy_task_is_the_default_and_has_no_marker() -> None:
    c = SyntheticTaskConfig()
    assert not c.mixed and c.vocab_size == 38 and c.input_context_length == c.context_length
    split = generate_split(c, "train")
    assert (split.kind == 0).all() and split.context.shape[1] == c.context_length
    assert SyntheticTaskConfig(kind_proportions=KindProportions(prefix=3.0)).mixed is False


def test_three_splits_are_independent_and_hashed() -> None:
    c = SyntheticTaskConfig(train_size=100, val_size=100, test_size=100, seed=1)
    splits = generate_splits(c)
    hashes = {name: split.data_hash() for name, split in splits.items()}
    assert len(set(hashes.values())) == 3
    assert generate_split(c, "test").data_hash() == hashes["test"]
    other = generate_split(c.model_copy(update={"seed": 2}), "test")
    assert other.data_hash() != hashes["test"]
    assert np.isclose(len(splits["test"]), 100)


def test_proportions_must_not_all_be_zero() -> None:
    with pytest.raises(ValueError, match="kind_proportions"):
        KindProportions(prefix=0.0)

"""Values of the token-weighted objectives against the reference, properties and edge cases.

The reference (``ref`` fixture, conftest.py) evaluates the formulas of docs/concepts/objectives.md in
60-digit arithmetic; nothing here reuses the library's own log-space computation.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from objectives import (
    ReferenceScale,
    concentration_corrected_reconstruction,
    masked_example_mean,
    normalized_concentration_corrected_reconstruction,
    normalized_concentration_corrected_token_weighted_reconstruction_loss,
    token_weight_stats,
    token_weighted_reconstruction,
    uniform_reconstruction,
)

PROPERTY_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
F64 = dict(rtol=1e-9, atol=1e-300)

# Surprisals in [0, 100]: exact zeros, ordinary values, integers and tiny magnitudes
# (no subnormals: their own relative precision is below rtol 1e-9).
SURPRISAL = st.one_of(
    st.just(0.0),
    st.floats(0.0, 100.0, allow_subnormal=False),
    st.integers(0, 100).map(float),
    st.floats(1e-30, 1e-20),
)
ALPHA = st.one_of(
    st.just(0.0),
    st.integers(0, 20).map(float),
    st.floats(0.0, 20.0, allow_subnormal=False),
)
# Whatever padding off the mask holds must never matter.
GARBAGE = st.sampled_from([float("nan"), float("inf"), float("-inf"), -3.0, 1e30, 0.0, 7.0])


@st.composite
def batches(draw, max_b: int = 6, max_t: int = 12, min_b: int = 1, min_t: int = 1):
    """(token_nll, base_nll, mask) in float64, with empty, full and random rows."""
    b_size = draw(st.integers(min_b, max_b))
    t_size = draw(st.integers(min_t, max_t))
    rows_mask = []
    for _ in range(b_size):
        kind = draw(st.sampled_from(["empty", "full", "random", "random", "prefix"]))
        if kind == "empty":
            rows_mask.append([False] * t_size)
        elif kind == "full":
            rows_mask.append([True] * t_size)
        elif kind == "prefix":
            k = draw(st.integers(1, t_size))
            rows_mask.append([t < k for t in range(t_size)])
        else:
            rows_mask.append(draw(st.lists(st.booleans(), min_size=t_size, max_size=t_size)))
    mask = torch.tensor(rows_mask, dtype=torch.bool)
    n = b_size * t_size
    base = torch.tensor(draw(st.lists(SURPRISAL, min_size=n, max_size=n)), dtype=torch.float64)
    token = torch.tensor(draw(st.lists(SURPRISAL, min_size=n, max_size=n)), dtype=torch.float64)
    base = base.reshape(b_size, t_size)
    token = token.reshape(b_size, t_size)
    if draw(st.booleans()):
        pad_b = torch.tensor(draw(st.lists(GARBAGE, min_size=n, max_size=n)), dtype=torch.float64)
        pad_l = torch.tensor(draw(st.lists(GARBAGE, min_size=n, max_size=n)), dtype=torch.float64)
        base = torch.where(mask, base, pad_b.reshape(b_size, t_size))
        token = torch.where(mask, token, pad_l.reshape(b_size, t_size))
    return token, base, mask


def _active(mask: torch.Tensor) -> torch.Tensor:
    return mask.any(dim=-1)


def _population_cv2(b_row: list[float]) -> float:
    """CV(b)^2 with the population variance, computed directly (scaled by the mean)."""
    n = len(b_row)
    mean = math.fsum(b_row) / n
    if mean == 0.0:
        return 0.0
    return math.fsum((v / mean - 1.0) ** 2 for v in b_row) / n


# --------------------------------------------------------------------------- reference agreement


@PROPERTY_SETTINGS
@given(data=batches(), alpha=ALPHA, c_base=st.floats(1e-3, 1e3))
def test_all_values_match_reference_float64(ref, data, alpha, c_base):
    token, base, mask = data
    expected = ref.batch(base, mask, alpha, token_nll=token, c_base=c_base)
    stats = token_weight_stats(base, mask, alpha)
    torch.testing.assert_close(stats.weights, expected["weights"], rtol=1e-9, atol=1e-15)
    torch.testing.assert_close(stats.kappa, expected["kappa"], **F64)
    torch.testing.assert_close(stats.base_uniform, expected["base_uniform"], **F64)
    torch.testing.assert_close(stats.base_weighted, expected["base_weighted"], **F64)
    assert torch.equal(stats.n_active.to(torch.int64), expected["n_active"])
    r_tok = token_weighted_reconstruction(token, base, mask, alpha)
    r_tilde = concentration_corrected_reconstruction(token, base, mask, alpha)
    r_hat = normalized_concentration_corrected_reconstruction(token, base, mask, alpha, c_base)
    loss = normalized_concentration_corrected_token_weighted_reconstruction_loss(
        token, base, mask, alpha, c_base
    )
    for got in (stats.weights, stats.kappa, stats.base_uniform, stats.base_weighted, r_tok,
                r_tilde, r_hat, loss):
        assert got.dtype == torch.float64
        assert torch.isfinite(got).all()
    assert r_tok.shape == r_tilde.shape == r_hat.shape == (base.shape[0],)
    assert loss.shape == ()
    torch.testing.assert_close(r_tok, expected["r_tok"], **F64)
    torch.testing.assert_close(r_tilde, expected["r_tilde"], **F64)
    torch.testing.assert_close(r_hat, expected["r_hat"], **F64)
    torch.testing.assert_close(loss, expected["loss"], **F64)


@PROPERTY_SETTINGS
@given(data=batches(), alpha=ALPHA, c_base=st.floats(1e-3, 1e3))
def test_float32_values_match_reference(ref, data, alpha, c_base):
    token, base, mask = data
    # Values below float32's normal range are flushed to 0 first: a subnormal float32 b_u
    # cannot hold 4 significant digits whatever the implementation does.
    base = torch.where(base.abs() < 1e-36, 0.0, base).to(torch.float32)
    token = token.to(torch.float32)
    expected = ref.batch(base, mask, alpha, token_nll=token, c_base=c_base)
    stats = token_weight_stats(base, mask, alpha)
    got = {
        "weights": stats.weights,
        "kappa": stats.kappa,
        "base_uniform": stats.base_uniform,
        "base_weighted": stats.base_weighted,
        "r_tok": token_weighted_reconstruction(token, base, mask, alpha),
        "r_tilde": concentration_corrected_reconstruction(token, base, mask, alpha),
        "r_hat": normalized_concentration_corrected_reconstruction(token, base, mask, alpha, c_base),
        "loss": normalized_concentration_corrected_token_weighted_reconstruction_loss(
            token, base, mask, alpha, c_base
        ),
    }
    for key, value in got.items():
        assert value.dtype == torch.float32, key
        assert torch.isfinite(value).all(), key
        torch.testing.assert_close(
            value.to(torch.float64), expected[key], rtol=1e-4, atol=1e-37,
            msg=lambda m, k=key: k + ": " + m,
        )


# --------------------------------------------------------------------------- properties


@PROPERTY_SETTINGS
@given(data=batches(), alpha=ALPHA)
def test_kappa_at_least_one_on_active_rows_and_zero_on_empty(data, alpha):
    _, base, mask = data
    kappa = token_weight_stats(base, mask, alpha).kappa
    active = _active(mask)
    assert (kappa[active] >= 1.0 - 1e-12).all()
    assert (kappa[~active] == 0).all()


@PROPERTY_SETTINGS
@given(data=batches())
def test_alpha_zero_is_uniform_with_kappa_one(data):
    token, base, mask = data
    stats = token_weight_stats(base, mask, 0.0)
    active = _active(mask)
    n = mask.sum(-1).clamp_min(1).to(torch.float64)
    uniform = mask.to(torch.float64) / n[:, None]
    torch.testing.assert_close(stats.weights, uniform, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(stats.kappa, active.to(torch.float64), rtol=1e-12, atol=0)
    mean_l = torch.where(mask, token, 0.0).sum(-1) / n
    r_tok = token_weighted_reconstruction(token, base, mask, 0.0)
    r_tilde = concentration_corrected_reconstruction(token, base, mask, 0.0)
    torch.testing.assert_close(r_tok, mean_l, **F64)
    torch.testing.assert_close(r_tilde, mean_l, **F64)
    torch.testing.assert_close(uniform_reconstruction(token, mask), mean_l, **F64)


@PROPERTY_SETTINGS
@given(data=batches(), alpha_pair=st.lists(ALPHA, min_size=2, max_size=2))
def test_kappa_nondecreasing_in_alpha(data, alpha_pair):
    _, base, mask = data
    low, high = sorted(alpha_pair)
    kappa_low = token_weight_stats(base, mask, low).kappa
    kappa_high = token_weight_stats(base, mask, high).kappa
    assert (kappa_high >= kappa_low * (1.0 - 1e-12)).all(), (low, high, kappa_low, kappa_high)


@PROPERTY_SETTINGS
@given(data=batches())
def test_kappa_one_is_one_plus_population_cv2(data):
    _, base, mask = data
    kappa = token_weight_stats(base, mask, 1.0).kappa
    for i, (b_row, m_row) in enumerate(zip(base.tolist(), mask.tolist(), strict=True)):
        active = [v for v, m in zip(b_row, m_row, strict=True) if m]
        if not active:
            continue
        expected = 1.0 + _population_cv2(active)
        assert math.isclose(float(kappa[i]), expected, rel_tol=1e-9), (active, float(kappa[i]))


@PROPERTY_SETTINGS
@given(data=batches(), alpha=ALPHA)
def test_baseline_r_tilde_is_base_uniform_per_example(ref, data, alpha):
    _, base, mask = data
    b_clean = torch.where(mask, base, 0.0)
    expected = ref.batch(base, mask, alpha)["base_uniform"]
    r_tilde = concentration_corrected_reconstruction(b_clean, base, mask, alpha)
    torch.testing.assert_close(r_tilde, expected, **F64)
    # R_tok at the baseline is R_tok^base = m_{alpha+1} / m_alpha, and kappa = that / b_u.
    stats = token_weight_stats(base, mask, alpha)
    r_tok = token_weighted_reconstruction(b_clean, base, mask, alpha)
    torch.testing.assert_close(r_tok, stats.base_weighted, **F64)
    active = _active(mask) & (stats.base_uniform > 0)
    torch.testing.assert_close(
        stats.kappa[active], (stats.base_weighted / stats.base_uniform)[active], **F64
    )


@PROPERTY_SETTINGS
@given(data=batches(), alpha=ALPHA)
def test_closed_form_equals_r_tok_over_kappa(data, alpha):
    token, base, mask = data
    stats = token_weight_stats(base, mask, alpha)
    r_tok = token_weighted_reconstruction(token, base, mask, alpha)
    r_tilde = concentration_corrected_reconstruction(token, base, mask, alpha)
    active = _active(mask)
    torch.testing.assert_close(r_tilde[active], (r_tok / stats.kappa)[active], **F64)
    assert (r_tilde[~active] == 0).all() and (r_tok[~active] == 0).all()
    # The closed form b_u * sum b^a l / sum b^(a+1), term by term in 60 digits.
    with mpmath.workdps(60):
        for i in range(base.shape[0]):
            idx = [t for t in range(base.shape[1]) if mask[i, t]]
            b = [mpmath.mpf(float(base[i, t])) for t in idx]
            ell = [mpmath.mpf(float(token[i, t])) for t in idx]
            if not idx or all(v == 0 for v in b):
                continue
            a = mpmath.mpf(alpha)
            pw = [(v**a if v > 0 else mpmath.mpf(0)) if a != 0 else mpmath.mpf(1) for v in b]
            b_u = mpmath.fsum(b) / len(b)
            closed = b_u * mpmath.fsum(p * x for p, x in zip(pw, ell, strict=True)) / mpmath.fsum(
                p * v for p, v in zip(pw, b, strict=True)
            )
            assert math.isclose(float(r_tilde[i]), float(closed), rel_tol=1e-9, abs_tol=1e-300)


@PROPERTY_SETTINGS
@given(data=batches(), alpha=ALPHA)
def test_weights_sum_to_one_on_active_rows_and_vanish_off_mask(data, alpha):
    _, base, mask = data
    weights = token_weight_stats(base, mask, alpha).weights
    assert weights.shape == base.shape
    assert (weights[~mask] == 0).all()
    assert (weights >= 0).all()
    sums = weights.sum(-1)
    active = _active(mask)
    torch.testing.assert_close(sums[active], torch.ones_like(sums[active]), rtol=1e-12, atol=0)
    assert (sums[~active] == 0).all()


@st.composite
def datasets(draw):
    """Several batches of different shapes, at least one with a positive active b."""
    parts = draw(st.lists(batches(max_b=5, max_t=9), min_size=2, max_size=4))
    return [(base, mask) for _, base, mask in parts]


@PROPERTY_SETTINGS
@given(dataset=datasets(), alpha=ALPHA)
def test_mean_baseline_r_hat_is_one_over_streamed_dataset(ref, dataset, alpha):
    assume(any(bool((b[m] > 0).any()) for b, m in dataset))
    scale = ReferenceScale()
    for base, mask in dataset:
        scale.update(base, mask)
    c_base = scale.compute()
    assert math.isclose(c_base, ref.c_base(dataset), rel_tol=1e-9)
    total, count = 0.0, 0
    for base, mask in dataset:
        b_clean = torch.where(mask, base, 0.0)
        r_hat = normalized_concentration_corrected_reconstruction(b_clean, base, mask, alpha, c_base)
        active = _active(mask)
        assert (r_hat[~active] == 0).all()
        total += math.fsum(r_hat[active].tolist())
        count += int(active.sum())
    assert math.isclose(total / count, 1.0, rel_tol=1e-9)


@PROPERTY_SETTINGS
@given(data=batches(), c_base=st.floats(1e-3, 1e3))
def test_alpha_zero_baseline_r_hat_is_base_uniform_over_c_base(data, c_base):
    _, base, mask = data
    b_clean = torch.where(mask, base, 0.0)
    stats = token_weight_stats(base, mask, 0.0)
    r_hat = normalized_concentration_corrected_reconstruction(b_clean, base, mask, 0.0, c_base)
    torch.testing.assert_close(r_hat, stats.base_uniform / c_base, **F64)


@PROPERTY_SETTINGS
@given(data=batches(), alpha=ALPHA, c_base=st.floats(1e-2, 1e2))
def test_scalar_loss_is_mean_of_r_hat_over_active_rows(data, alpha, c_base):
    token, base, mask = data
    r_hat = normalized_concentration_corrected_reconstruction(token, base, mask, alpha, c_base)
    loss = normalized_concentration_corrected_token_weighted_reconstruction_loss(
        token, base, mask, alpha, c_base
    )
    active = _active(mask)
    expected = r_hat[active].mean() if active.any() else torch.zeros((), dtype=torch.float64)
    torch.testing.assert_close(loss, expected, **F64)
    torch.testing.assert_close(masked_example_mean(r_hat, mask), expected, **F64)


# --------------------------------------------------------------------------- float32 extremes

EXTREME_ROWS = [
    [100.0, 99.0, 50.0, 1.0, 0.5, 1e-3],
    [100.0, 100.0, 100.0],
    [1e-25, 1e-30, 3e-28, 7e-26],
    [1e-30, 1e-30, 1e-30, 1e-30, 1e-30],
    [1e-25, 1e-21, 5e-22, 2e-30, 1e-29],
    [1e-25, 0.0, 1e-30, 0.0],
    [100.0, 1e-25, 3.0, 0.0, 1e-30],
    [2.5, 0.0, 0.0, 80.0],
    [0.0, 0.0, 0.0],
    [42.0],
    [],
]
EXTREME_ALPHAS = [0.0, 0.25, 1.0, 2.0, 3.7, 10.0, 17.0, 20.0]


def _padded(rows: list[list[float]], pad: float = float("nan")):
    width = max(len(r) for r in rows)
    base = torch.full((len(rows), width), pad, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        base[i, : len(r)] = torch.tensor(r, dtype=torch.float64)
        mask[i, : len(r)] = True
    return base, mask


@pytest.mark.parametrize("alpha", EXTREME_ALPHAS)
def test_float32_extremes_match_high_precision_reference(ref, alpha):
    base64, mask = _padded(EXTREME_ROWS)
    base = base64.to(torch.float32)
    generator = torch.Generator().manual_seed(int(alpha * 100))
    token = (torch.rand(base.shape, generator=generator) * 10).to(torch.float32)
    token = torch.where(mask, token, torch.tensor(float("inf")))
    c_base = 3.25
    expected = ref.batch(base, mask, alpha, token_nll=token, c_base=c_base)
    stats = token_weight_stats(base, mask, alpha)
    r_tok = token_weighted_reconstruction(token, base, mask, alpha)
    r_tilde = concentration_corrected_reconstruction(token, base, mask, alpha)
    r_hat = normalized_concentration_corrected_reconstruction(token, base, mask, alpha, c_base)
    loss = normalized_concentration_corrected_token_weighted_reconstruction_loss(
        token, base, mask, alpha, c_base
    )
    got = {
        "weights": stats.weights,
        "kappa": stats.kappa,
        "base_uniform": stats.base_uniform,
        "base_weighted": stats.base_weighted,
        "r_tok": r_tok,
        "r_tilde": r_tilde,
        "r_hat": r_hat,
        "loss": loss,
    }
    for key, value in got.items():
        assert value.dtype == torch.float32, key
        assert torch.isfinite(value).all(), (key, value)
        atol = 1e-37 if key == "weights" else 0.0  # below float32's normal range
        torch.testing.assert_close(
            value.to(torch.float64), expected[key], rtol=1e-4, atol=atol,
            msg=lambda m, k=key: k + ": " + m,
        )


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0, 20.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exact_zeros_get_zero_weight_when_alpha_positive(alpha, dtype):
    base = torch.tensor([[0.0, 2.0, 0.0, 5.0], [1e-30, 0.0, 0.0, 0.0]], dtype=dtype)
    mask = torch.ones_like(base, dtype=torch.bool)
    weights = token_weight_stats(base, mask, alpha).weights
    assert (weights[base == 0] == 0).all()
    assert float(weights[1, 0]) == pytest.approx(1.0)
    assert float(weights[0].sum()) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 7.0, 20.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_zero_rows_fall_back_to_uniform(alpha, dtype):
    base = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 9.0]], dtype=dtype)
    mask = torch.tensor([[True, True, True, False], [True, True, True, False]])
    token = torch.tensor([[1.0, 2.0, 6.0, float("nan")], [3.0, 0.0, 0.0, float("inf")]], dtype=dtype)
    stats = token_weight_stats(base, mask, alpha)
    third = torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0], dtype=dtype)
    torch.testing.assert_close(stats.weights, torch.stack([third, third]))
    torch.testing.assert_close(stats.kappa, torch.ones(2, dtype=dtype), rtol=1e-6, atol=0)
    assert (stats.base_uniform == 0).all() and (stats.base_weighted == 0).all()
    r_tok = token_weighted_reconstruction(token, base, mask, alpha)
    r_tilde = concentration_corrected_reconstruction(token, base, mask, alpha)
    expected = torch.tensor([3.0, 1.0], dtype=dtype)
    torch.testing.assert_close(r_tok, expected)
    torch.testing.assert_close(r_tilde, expected)
    r_hat = normalized_concentration_corrected_reconstruction(token, base, mask, alpha, 2.0)
    torch.testing.assert_close(r_hat, expected / 2)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 20.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empty_rows_are_zero_everywhere(alpha, dtype):
    base = torch.tensor(
        [[1.0, 2.0, 3.0], [float("nan"), float("inf"), -1.0], [0.0, 0.0, 0.0]], dtype=dtype
    )
    mask = torch.tensor([[True, True, False], [False, False, False], [False, False, False]])
    token = torch.tensor(
        [[1.0, 1.0, float("nan")], [float("inf"), float("nan"), 2.0], [4.0, 4.0, 4.0]],
        dtype=dtype,
    )
    stats = token_weight_stats(base, mask, alpha)
    for value in (stats.kappa, stats.base_uniform, stats.base_weighted):
        assert (value[1:] == 0).all()
        assert torch.isfinite(value).all()
    assert (stats.weights[1:] == 0).all()
    assert stats.n_active.tolist() == [2, 0, 0]
    for fn_value in (
        token_weighted_reconstruction(token, base, mask, alpha),
        concentration_corrected_reconstruction(token, base, mask, alpha),
        normalized_concentration_corrected_reconstruction(token, base, mask, alpha, 1.5),
        uniform_reconstruction(token, mask),
    ):
        assert (fn_value[1:] == 0).all()
        assert torch.isfinite(fn_value).all()


@pytest.mark.parametrize("alpha", [0.0, 1.0, 3.0])
def test_empty_rows_excluded_from_batch_mean(alpha):
    generator = torch.Generator().manual_seed(7)
    base = torch.rand(3, 5, generator=generator, dtype=torch.float64) * 4
    token = torch.rand(3, 5, generator=generator, dtype=torch.float64) * 4
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]], dtype=torch.bool)
    extra_b = torch.full((2, 5), float("nan"), dtype=torch.float64)
    extra_l = torch.full((2, 5), float("inf"), dtype=torch.float64)
    extra_m = torch.zeros(2, 5, dtype=torch.bool)

    token_a = token.clone().requires_grad_(True)
    loss_a = normalized_concentration_corrected_token_weighted_reconstruction_loss(
        token_a, base, mask, alpha, 2.0
    )
    loss_a.backward()
    token_b = torch.cat([token, extra_l]).requires_grad_(True)
    loss_b = normalized_concentration_corrected_token_weighted_reconstruction_loss(
        token_b, torch.cat([base, extra_b]), torch.cat([mask, extra_m]), alpha, 2.0
    )
    loss_b.backward()
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-12, atol=0)
    torch.testing.assert_close(token_b.grad[:3], token_a.grad, rtol=1e-12, atol=0)
    assert (token_b.grad[3:] == 0).all()


def test_batch_without_active_tokens_gives_zero_loss_and_no_nan():
    token = torch.full((2, 3), float("nan"), dtype=torch.float64, requires_grad=True)
    base = torch.full((2, 3), float("inf"), dtype=torch.float64)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss = normalized_concentration_corrected_token_weighted_reconstruction_loss(
        token, base, mask, 1.0, 1.0
    )
    assert float(loss.detach()) == 0.0
    if loss.requires_grad:
        loss.backward()
        assert token.grad is None or (token.grad == 0).all()


def _all_outputs(token, base, mask, alpha):
    token = token.clone().requires_grad_(True)
    stats = token_weight_stats(base, mask, alpha)
    values = [
        stats.weights, stats.kappa, stats.base_uniform, stats.base_weighted,
        token_weighted_reconstruction(token, base, mask, alpha),
        concentration_corrected_reconstruction(token, base, mask, alpha),
        normalized_concentration_corrected_reconstruction(token, base, mask, alpha, 2.0),
        uniform_reconstruction(token, mask),
    ]
    loss = normalized_concentration_corrected_token_weighted_reconstruction_loss(
        token, base, mask, alpha, 2.0
    )
    loss.backward()
    return [*values, loss, token.grad]


@pytest.mark.parametrize("alpha", [0.0, 1.0, 20.0])
def test_off_mask_inf_and_nan_do_not_leak(alpha):
    generator = torch.Generator().manual_seed(3)
    base = torch.rand(4, 6, generator=generator, dtype=torch.float64) * 5
    token = torch.rand(4, 6, generator=generator, dtype=torch.float64) * 5
    mask = torch.rand(4, 6, generator=generator) < 0.6
    mask[0] = True
    mask[3] = False
    pads = torch.tensor([float("nan"), float("inf"), float("-inf"), -1.0], dtype=torch.float64)
    pad = pads[torch.arange(24) % 4].reshape(4, 6)
    clean = _all_outputs(torch.where(mask, token, 0.0), torch.where(mask, base, 1.0), mask, alpha)
    dirty = _all_outputs(
        torch.where(mask, token, pad.flip(0)), torch.where(mask, base, pad), mask, alpha
    )
    for c, d in zip(clean, dirty, strict=True):
        assert torch.isfinite(d).all()
        torch.testing.assert_close(d, c, rtol=0, atol=0)
    assert (dirty[-1][~mask] == 0).all()


def test_dtype_promotion_and_shapes():
    base = torch.tensor([[1.0, 2.0]], dtype=torch.float32)
    token = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True]])
    assert token_weighted_reconstruction(token, base, mask, 1.0).dtype == torch.float64
    assert token_weight_stats(base, mask, 1.0).kappa.dtype == torch.float32
    assert token_weight_stats(base, mask, 1.0).weights.shape == (1, 2)


def test_alpha_accepts_ints():
    base = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True]])
    expected = token_weight_stats(base, mask, 2.0).kappa
    torch.testing.assert_close(token_weight_stats(base, mask, 2).kappa, expected)
    # kappa_2 of (1, 3): m3 / (m2 m1) = 14 / (5 * 2) = 1.4
    assert float(expected[0]) == pytest.approx(1.4, rel=1e-12)

"""Diagnostics: kappa summaries (per batch and per epoch) and the baseline self-check."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from objectives import (
    KAPPA_SUMMARY_KEYS,
    KappaSummaryAccumulator,
    baseline_self_check,
    kappa_summary,
    squared_coefficient_of_variation,
    token_weight_stats,
)

REQUIRED_KEYS = {
    "kappa_mean", "kappa_p50", "kappa_p90", "kappa_max", "cv2_mean",
    "inv_kappa_mean", "inv_kappa_min", "inv_kappa_max",
}

# Rows chosen so that kappa_2 = n S_3 / (S_2 S_1) and CV^2 are simple fractions.
HAND_ROWS = [[1, 1], [1, 3], [0, 2], [1, 2, 3], []]


def _padded(rows, dtype=torch.float64, width=None, pad=float("nan")):
    width = width or max(len(r) for r in rows)
    base = torch.full((len(rows), width), pad, dtype=dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            base[i, : len(r)] = torch.tensor([float(v) for v in r], dtype=dtype)
            mask[i, : len(r)] = True
    return base, mask


def _exact_kappa(row, alpha: int) -> Fraction:
    n = len(row)
    s_alpha = sum(Fraction(v) ** alpha for v in row)
    s_alpha_plus_one = sum(Fraction(v) ** (alpha + 1) for v in row)
    return n * s_alpha_plus_one / (s_alpha * sum(Fraction(v) for v in row))


def _exact_cv2(row) -> Fraction:
    n = len(row)
    mean = Fraction(sum(row), n)
    return sum((Fraction(v) - mean) ** 2 for v in row) / n / mean**2


def _quantile(values: list[float], q: float) -> float:
    """torch.quantile's default ('linear') interpolation, written out."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def _expected_summary(kappas: list[float], cv2s: list[float]) -> dict[str, float]:
    inverse = [1.0 / k for k in kappas]
    return {
        "kappa_mean": math.fsum(kappas) / len(kappas),
        "kappa_p50": _quantile(kappas, 0.5),
        "kappa_p90": _quantile(kappas, 0.9),
        "kappa_max": max(kappas),
        "cv2_mean": math.fsum(cv2s) / len(cv2s),
        "inv_kappa_mean": math.fsum(inverse) / len(inverse),
        "inv_kappa_min": min(inverse),
        "inv_kappa_max": max(inverse),
    }


def _assert_summary(summary, expected, rel=1e-12):
    for key, value in expected.items():
        assert float(summary[key]) == pytest.approx(value, rel=rel), key


def test_kappa_summary_on_hand_computed_batch():
    base, mask = _padded(HAND_ROWS)
    summary = kappa_summary(base, mask, 2.0)
    assert set(summary) >= REQUIRED_KEYS
    assert set(summary) == set(KAPPA_SUMMARY_KEYS)
    active = [r for r in HAND_ROWS if r]
    kappas = [float(_exact_kappa(r, 2)) for r in active]
    assert kappas == pytest.approx([1.0, 1.4, 2.0, 9 / 7])
    cv2s = [float(_exact_cv2(r)) for r in active]
    assert cv2s == pytest.approx([0.0, 0.25, 1.0, 1 / 6])
    expected = _expected_summary(kappas, cv2s)
    # Written out: sorted kappa = 1, 9/7, 1.4, 2; p50 at position 1.5, p90 at 2.7.
    assert expected["kappa_p50"] == pytest.approx((9 / 7 + 1.4) / 2)
    assert expected["kappa_p90"] == pytest.approx(1.4 + 0.7 * 0.6)
    _assert_summary(summary, expected)
    if "inv_kappa_ess_fraction" in summary:
        inverse = [1 / k for k in kappas]
        ess = sum(inverse) ** 2 / (len(inverse) * sum(v * v for v in inverse))
        assert float(summary["inv_kappa_ess_fraction"]) == pytest.approx(ess, rel=1e-12)
    # The quantiles follow torch.quantile exactly.
    kappa_tensor = torch.tensor(kappas, dtype=torch.float64)
    assert float(summary["kappa_p90"]) == pytest.approx(float(torch.quantile(kappa_tensor, 0.9)))


def test_kappa_summary_accepts_precomputed_stats():
    base, mask = _padded(HAND_ROWS)
    stats = token_weight_stats(base, mask, 2.0)
    with_stats = kappa_summary(base, mask, 2.0, stats=stats)
    without = kappa_summary(base, mask, 2.0)
    for key in KAPPA_SUMMARY_KEYS:
        assert float(with_stats[key]) == pytest.approx(float(without[key]), rel=1e-12)


@pytest.mark.parametrize("alpha", [0, 1])
def test_kappa_summary_at_alpha_zero_and_one(alpha):
    base, mask = _padded(HAND_ROWS, dtype=torch.float32)
    summary = kappa_summary(base, mask, float(alpha))
    active = [r for r in HAND_ROWS if r]
    kappas = [float(_exact_kappa(r, alpha)) for r in active]
    cv2s = [float(_exact_cv2(r)) for r in active]
    if alpha == 0:
        assert kappas == [1.0] * 4
    else:
        assert kappas == pytest.approx([1 + c for c in cv2s])
    _assert_summary(summary, _expected_summary(kappas, cv2s), rel=1e-5)


def test_squared_coefficient_of_variation_uses_population_variance():
    base, mask = _padded(HAND_ROWS + [[0, 0, 0], [1e-30, 3e-30]])
    cv2 = squared_coefficient_of_variation(base, mask)
    expected = [float(_exact_cv2(r)) for r in HAND_ROWS[:4]] + [0.0, 0.0, 0.25]
    assert cv2.tolist()[:4] == pytest.approx(expected[:4], rel=1e-12)
    assert float(cv2[4]) == 0.0  # the empty row
    assert float(cv2[5]) == 0.0  # the all-zero row
    assert float(cv2[6]) == pytest.approx(0.25, rel=1e-9)


def _random_batch(seed: int, b_size: int, t_size: int, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    base = (torch.rand(b_size, t_size, generator=generator, dtype=torch.float64) * 10).to(dtype)
    base = torch.where(torch.rand(b_size, t_size, generator=generator) < 0.15, 0.0, base)
    mask = torch.rand(b_size, t_size, generator=generator) < 0.75
    mask[0] = True
    if b_size > 2:
        mask[-1] = False
    return base, mask


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.5, 20.0])
def test_accumulator_equals_summary_of_concatenation(alpha):
    shapes = [(4, 7), (1, 3), (6, 12), (3, 1), (5, 9)]
    batches = [_random_batch(seed, *shape) for seed, shape in enumerate(shapes)]
    accumulator = KappaSummaryAccumulator(alpha)
    for base, mask in batches:
        accumulator.update(base, mask)
    width = max(t for _, t in shapes)
    pad_base = torch.cat(
        [torch.nn.functional.pad(b, (0, width - b.shape[1]), value=float("nan")) for b, _ in batches]
    )
    pad_mask = torch.cat(
        [torch.nn.functional.pad(m, (0, width - m.shape[1]), value=False) for _, m in batches]
    )
    whole = kappa_summary(pad_base, pad_mask, alpha)
    epoch = accumulator.compute()
    assert set(epoch) == set(whole)
    for key in whole:
        assert float(epoch[key]) == pytest.approx(float(whole[key]), rel=1e-12), key
    kappas = token_weight_stats(pad_base, pad_mask, alpha).kappa[pad_mask.any(-1)]
    assert float(epoch["kappa_max"]) == pytest.approx(float(kappas.max()), rel=1e-12)
    assert float(epoch["kappa_p90"]) == pytest.approx(float(torch.quantile(kappas, 0.9)), rel=1e-12)


def test_accumulator_accepts_stats():
    base, mask = _random_batch(0, 4, 6)
    a, b = KappaSummaryAccumulator(1.5), KappaSummaryAccumulator(1.5)
    a.update(base, mask)
    b.update(base, mask, stats=token_weight_stats(base, mask, 1.5))
    for key, value in a.compute().items():
        assert float(b.compute()[key]) == pytest.approx(float(value), rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0, 5.0, 20.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_baseline_self_check_passes_on_random_data(alpha, dtype):
    for seed in range(3):
        base, mask = _random_batch(100 + seed, 8, 11, dtype=dtype)
        base = torch.where(mask, base, torch.tensor(float("nan"), dtype=dtype))
        check = baseline_self_check(base, mask, alpha)
        assert check.passed, check.reason
        assert check.deviation < 1e-5
        assert check.mean_r_hat == pytest.approx(1.0, abs=1e-5)
        assert not check.reason


def test_baseline_self_check_passes_on_tiny_and_large_surprisals():
    base, mask = _padded([[1e-25, 1e-30, 0.0], [100.0, 99.0, 1e-3], [1e-21, 2e-21, 3e-21]],
                         dtype=torch.float32)
    for alpha in (0.0, 1.0, 20.0):
        check = baseline_self_check(base, mask, alpha)
        assert check.passed, check.reason


def test_baseline_self_check_fails_with_reason_when_base_is_all_zero():
    base = torch.zeros(3, 4, dtype=torch.float64)
    mask = torch.ones(3, 4, dtype=torch.bool)
    check = baseline_self_check(base, mask, 1.0)
    assert not check.passed
    assert isinstance(check.reason, str) and check.reason


def test_baseline_self_check_fails_with_reason_on_non_finite_base():
    base, mask = _random_batch(5, 4, 5)
    base = base.clone()
    base[0, 0] = float("nan")
    check = baseline_self_check(base, mask, 1.0)
    assert not check.passed
    assert check.reason

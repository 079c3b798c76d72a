"""The report's statistics on cases with hand-computed answers."""

import math
import random

import pytest
from scipy import stats as scipy_stats

from sweeps.report.statistics import (
    holm,
    interpolate_log,
    mean_interval,
    metric_range,
    paired_difference,
)


def test_t_interval_hand_computed():
    # mean 3, sd sqrt(2.5), se sqrt(0.5), t(0.975, 4) = 2.776445: half-width 1.963243.
    interval = mean_interval([1, 2, 3, 4, 5])
    assert interval.mean == pytest.approx(3.0)
    assert interval.ci_low == pytest.approx(1.036757, abs=1e-6)
    assert interval.ci_high == pytest.approx(4.963243, abs=1e-6)
    assert (interval.n, interval.n_nan) == (5, 0)


def test_interval_clipped_to_the_metric_range():
    # NMI 0.9, 1, 1: mean 0.96667, half-width t(0.975, 2) * 0.057735 / sqrt(3) = 0.143422.
    interval = mean_interval([0.9, 1.0, 1.0], metric_range("test/latent_nmi"))
    assert interval.mean == pytest.approx(0.966667, abs=1e-6)
    assert interval.ci_low == pytest.approx(0.823245, abs=1e-6)
    assert interval.ci_high == 1.0  # 1.110 unclipped
    unclipped = mean_interval([0.9, 1.0, 1.0])
    assert unclipped.ci_high == pytest.approx(1.110088, abs=1e-6)


def test_metric_ranges():
    assert metric_range("selected/test/prefix/latent_nmi") == (0.0, 1.0)
    assert metric_range("val/latent_ari") == (-1.0, 1.0)
    assert metric_range("test/latent_nmi_shuffled") == (0.0, 1.0)
    assert metric_range("test/latent_ami") == (None, 1.0)
    assert metric_range("val/kl") == (0.0, None)
    assert metric_range("test/recon_uniform") == (0.0, None)
    assert metric_range("val/kappa_p90") == (1.0, None)
    # z's NMI with kappa quartiles is an NMI, not a kappa: clipped at 1 from below it read
    # [1, 1] around a mean of 0.01.
    assert metric_range("selected/test/latent_nmi_kappa") == (0.0, 1.0)
    assert metric_range("test/latent_nmi_length") == (0.0, 1.0)
    assert metric_range("selected/test/latent_ami_within_length") == (None, 1.0)
    interval = mean_interval([0.012, 0.003, 0.002, 0.012, 0.021], metric_range("test/latent_nmi_kappa"))
    assert 0.0 <= interval.ci_low < interval.mean < interval.ci_high < 0.05
    assert metric_range("test/grad_share_prefix") == (0.0, 1.0)
    assert metric_range("val/something_new") == (None, None)


def test_nan_is_counted_never_silently_dropped():
    interval = mean_interval([0.5, math.nan, 0.7, None])
    assert (interval.n, interval.n_nan) == (2, 2)
    assert interval.mean == pytest.approx(0.6)
    assert interval.values == [0.5, None, 0.7, None]
    one = mean_interval([0.4, math.nan])
    assert (one.mean, one.ci_low, one.n, one.n_nan) == (0.4, None, 1, 1)
    assert mean_interval([math.nan]).mean is None


def test_paired_difference_hand_computed():
    # diffs 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t = 0.2 / (0.1 / sqrt 3) = 3.4641 with 2 df;
    # P(|T| > 3.4641) = 1 - 2 * 3.4641 / (2 sqrt(2 + 12)) = 0.074180; half-width 0.248414.
    diff = paired_difference({0: 0.5, 1: 0.7, 2: 0.9}, {0: 0.4, 1: 0.5, 2: 0.6})
    assert diff.mean_diff == pytest.approx(0.2)
    assert diff.ci_low == pytest.approx(-0.048414, abs=1e-6)
    assert diff.ci_high == pytest.approx(0.448414, abs=1e-6)
    assert diff.p_value == pytest.approx(0.074180, abs=1e-6)
    assert (diff.n_pairs, diff.seeds) == (3, [0, 1, 2])


@pytest.mark.parametrize("scale", [1e-12, 1e-3, 1.0, 1e6])
def test_interval_and_p_value_agree_with_scipy_stats(scale):
    # The report computes Student t through scipy.special; scipy.stats' t.ppf and ttest_1samp
    # are the independent reference, on 2 to 60 seeds, near-constant and large-offset values.
    rng = random.Random(17)
    for n in (2, 3, 4, 5, 7, 10, 30, 60):
        for offset in (0.0, 0.3 * scale, 50 * scale):
            values = [offset + rng.gauss(0, scale) for _ in range(n)]
            interval = mean_interval(values)
            mean = sum(values) / n
            sem = scipy_stats.sem(values)
            half = scipy_stats.t.ppf(0.975, n - 1) * sem
            assert interval.ci_low == pytest.approx(mean - half, rel=1e-9, abs=1e-12 * scale)
            assert interval.ci_high == pytest.approx(mean + half, rel=1e-9, abs=1e-12 * scale)
            if n >= 3:
                diff = paired_difference(dict(enumerate(values)), dict.fromkeys(range(n), 0.0))
                expected = scipy_stats.ttest_1samp(values, 0.0).pvalue
                assert diff.p_value == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_pairing_is_by_seed_not_by_position():
    diff = paired_difference({2: 1.0, 0: 0.0, 1: 0.5}, {0: 0.0, 1: 0.5, 2: 1.0, 7: 3.0})
    assert diff.diffs == [0.0, 0.0, 0.0] and diff.n_pairs == 3 and diff.p_value == 1.0


def test_fewer_than_three_pairs_has_no_p_value():
    diff = paired_difference({0: 0.9, 1: 0.8}, {0: 0.1, 1: 0.2})
    assert diff.n_pairs == 2 and diff.p_value is None and diff.mean_diff == pytest.approx(0.7)


def test_nan_pair_is_counted():
    diff = paired_difference({0: math.nan, 1: 0.7, 2: 0.9, 3: 0.6}, {0: 0.4, 1: 0.5, 2: 0.6, 3: 0.5})
    assert (diff.n_pairs, diff.n_nan) == (3, 1) and diff.seeds == [1, 2, 3]


def test_difference_interval_clipped_to_the_range_width():
    diff = paired_difference({0: 1.0, 1: 1.0, 2: 0.0}, {0: 0.0, 1: 0.0, 2: 0.0}, (0.0, 1.0))
    assert diff.ci_high == 1.0 and diff.ci_low >= -1.0


def test_holm_textbook():
    # p = .01, .04, .03, .005 (m = 4): .005*4 = .02, .01*3 = .03, .03*2 = .06, max(.04*1, .06).
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, None, 0.9]) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    assert holm([]) == []


def test_interpolate_in_log_beta():
    assert interpolate_log([1, 4], [0.0, 1.0], 2.0) == pytest.approx(0.5)
    assert interpolate_log([1, 4], [0.2, 1.0], 4.0) == 1.0
    assert interpolate_log([1, 4], [0.0, 1.0], 8.0) is None  # never extrapolates
    assert interpolate_log([1, 4], [0.0, math.nan], 2.0) is None

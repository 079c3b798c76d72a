"""The report's statistics: t intervals over seeds, paired differences, Holm, metric ranges.

Every function here is pure (no MLflow, no Ray) and says how it treats NaN: a NaN value is
never dropped silently; it is counted (``n_nan``) and the count travels into the report's
words. Intervals are Student t 95% intervals over seeds, clipped to the metric's range.
"""

from __future__ import annotations

import math
import re
import statistics as pystats
from collections.abc import Sequence
from dataclasses import dataclass, field

# Student t through scipy.special (what scipy.stats.t calls): the driver imports the report at
# start-up, and scipy.stats costs it ten times as much to import.
from scipy.special import stdtr, stdtrit

__all__ = [
    "CONFIDENCE",
    "MIN_PAIRS_FOR_CLAIM",
    "Interval",
    "PairedDifference",
    "holm",
    "interpolate_log",
    "mean_interval",
    "metric_range",
    "paired_difference",
]

CONFIDENCE = 0.95
MIN_PAIRS_FOR_CLAIM = 3
"""Below this many seeds (pairs) the report gives no p-value and makes no claim."""

# Metric name (the part after split and kind) -> (low, high) of its possible values.
# Matched in order; the first pattern that matches wins. None: unbounded on that side.
_RANGES: tuple[tuple[str, tuple[float | None, float | None]], ...] = (
    # NMIs of z against the label, shuffled labels, length or kappa quartiles: before the
    # kappa pattern, which would otherwise read latent_nmi_kappa as a kappa (>= 1).
    (r"latent_nmi(_auc|_shuffled|_length|_kappa)?$", (0.0, 1.0)),
    (r"latent_ami(_within_length)?$", (None, 1.0)),  # 1 at most; below 0 where worse than chance
    (r"nmi_auc$", (0.0, 1.0)),
    (r"latent_ari$", (-1.0, 1.0)),
    (r"(share|_frac|fraction)(_\w+)?$", (0.0, 1.0)),
    (r"share_", (0.0, 1.0)),
    (r"rank_corr\w*$|spearman\w*$", (-1.0, 1.0)),
    (r"^kappa(_mean|_p\d+|_max|_min)?$", (1.0, None)),
    (r"inv_kappa\w*$", (0.0, 1.0)),
    (r"(loss|recon_\w+|kl|mutual_info|mi_\w+|active_units|cv2_mean|c_base|b_u|epochs?_to_\w+)$",
     (0.0, None)),
)


def metric_range(name: str) -> tuple[float | None, float | None]:
    """The range a metric's values can take (``val/latent_nmi`` -> ``(0, 1)``).

    The split and kind prefixes are ignored. Unknown metrics are unbounded ``(None, None)``,
    so an interval is never clipped on a guess.
    """
    base = name.rsplit("/", 1)[-1]
    for pattern, bounds in _RANGES:
        if re.search(pattern, base):
            return bounds
    return (None, None)


def _clip(value: float, bounds: tuple[float | None, float | None]) -> float:
    low, high = bounds
    if low is not None:
        value = max(low, value)
    if high is not None:
        value = min(high, value)
    return value


@dataclass
class Interval:
    """Mean and clipped t interval of one set of per-seed values.

    Attributes:
        mean: mean of the finite values (None when there is none).
        ci_low, ci_high: the 95% t interval, clipped to the range (None with fewer than 2).
        n: finite values used. n_nan: values that were NaN/inf/missing (counted, not used).
        values: the per-seed values as given (NaN kept as None).
    """

    mean: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    n_nan: int = 0
    values: list[float | None] = field(default_factory=list)


def _finite(values: Sequence[float | None]) -> tuple[list[float], int]:
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return finite, len(values) - len(finite)


def _standard_error(values: Sequence[float]) -> float:
    """The mean's standard error: the interval and the paired test both scale by it."""
    return pystats.stdev(values) / math.sqrt(len(values))


def _t_half_width(values: Sequence[float]) -> float:
    """Half-width of the t interval (0 when all values are equal)."""
    quantile = float(stdtrit(len(values) - 1, 0.5 + CONFIDENCE / 2))
    return quantile * _standard_error(values)


def mean_interval(
    values: Sequence[float | None], bounds: tuple[float | None, float | None] = (None, None)
) -> Interval:
    """Mean and Student t 95% interval over seeds, clipped to ``bounds``.

    NaN, inf and None are excluded from the mean and counted in ``n_nan``. One finite value
    gives a mean without an interval; none gives neither.
    """
    finite, n_nan = _finite(values)
    shown = [float(v) if v is not None and math.isfinite(v) else None for v in values]
    if not finite:
        return Interval(None, None, None, 0, n_nan, shown)
    mean = pystats.fmean(finite)
    if len(finite) < 2:
        return Interval(mean, None, None, 1, n_nan, shown)
    half = _t_half_width(finite)
    return Interval(mean, _clip(mean - half, bounds), _clip(mean + half, bounds), len(finite),
                    n_nan, shown)


@dataclass
class PairedDifference:
    """``treated - baseline`` paired by seed.

    Attributes:
        mean_diff, ci_low, ci_high: mean of the per-seed differences and its t 95% interval
            (a difference of a metric in [a, b] is clipped to [a - b, b - a]).
        p_value: two-sided paired t-test (None with fewer than MIN_PAIRS_FOR_CLAIM pairs).
        n_pairs: seeds with a finite value on both sides.
        n_nan: seeds present on both sides where either value was not finite (counted).
        seeds: the seeds used; diffs: the per-seed differences, in the same order.
    """

    mean_diff: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n_pairs: int
    n_nan: int = 0
    seeds: list[int] = field(default_factory=list)
    diffs: list[float] = field(default_factory=list)


def _difference_bounds(bounds: tuple[float | None, float | None]) -> tuple[float | None, float | None]:
    low, high = bounds
    if low is None or high is None:
        return (None, None)
    return (low - high, high - low)


def _paired_p(diffs: Sequence[float]) -> float:
    """Two-sided one-sample t-test of the mean difference against 0."""
    if pystats.pstdev(diffs) == 0:
        # Every seed gives the same difference: exactly 0 is no evidence, anything else is
        # as strong as a t-test can say (t is infinite).
        return 1.0 if diffs[0] == 0 else 0.0
    t = pystats.fmean(diffs) / _standard_error(diffs)
    return float(2 * stdtr(len(diffs) - 1, -abs(t)))


def paired_difference(
    treated: dict[int, float | None],
    baseline: dict[int, float | None],
    bounds: tuple[float | None, float | None] = (None, None),
) -> PairedDifference:
    """The seed-paired difference ``treated - baseline`` (seeds present on both sides).

    Args:
        treated, baseline: seed -> value. A seed on one side only is not a pair.
        bounds: the metric's range; the difference's interval is clipped to its width.
    """
    seeds, diffs, n_nan = [], [], 0
    for seed in sorted(set(treated) & set(baseline)):
        a, b = treated[seed], baseline[seed]
        if a is None or b is None or not math.isfinite(a) or not math.isfinite(b):
            n_nan += 1
            continue
        seeds.append(seed)
        diffs.append(float(a) - float(b))
    if not diffs:
        return PairedDifference(None, None, None, None, 0, n_nan)
    interval = mean_interval(diffs, _difference_bounds(bounds))
    p_value = _paired_p(diffs) if len(diffs) >= MIN_PAIRS_FOR_CLAIM else None
    return PairedDifference(interval.mean, interval.ci_low, interval.ci_high, p_value,
                            len(diffs), n_nan, seeds, diffs)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (step-down; monotone; capped at 1).

    None entries (no test) stay None and do not count towards the family size.
    """
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(indexed)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[index] = running
    return adjusted


def interpolate_log(xs: Sequence[float], ys: Sequence[float | None], x: float) -> float | None:
    """``y`` at ``x`` by linear interpolation in ``log x`` between the nearest grid points.

    Used to read a stack's metric at another stack's effective beta. Returns None outside
    ``[min(xs), max(xs)]`` (never extrapolates) or when a neighbour is None/NaN; an exact
    grid point returns its own value. ``xs`` must be positive.
    """
    points = sorted(zip(xs, ys, strict=True))
    tolerance = 1e-9
    for px, py in points:
        if abs(math.log(px) - math.log(x)) <= tolerance:
            return py if py is not None and math.isfinite(py) else None
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 < x < x1:
            if y0 is None or y1 is None or not (math.isfinite(y0) and math.isfinite(y1)):
                return None
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return None

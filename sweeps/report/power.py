"""Power by design: what a primary contrast's seeds can detect, and the seeds an effect needs.

A contrast is a two-sided paired t test over seeds (:func:`sweeps.report.statistics.paired_difference`).
With ``n`` pairs whose differences have standard deviation ``sd``, a true mean difference
``d`` makes the t statistic noncentral t with ``n - 1`` degrees of freedom and noncentrality
``d / sd * sqrt(n)``; the power at level ``a`` is the chance that ``|t|`` passes the t
quantile ``1 - a / 2``. This module computes it exactly from the noncentral t distribution
(not a normal approximation, which overstates power at five seeds), and from it:

- the smallest effect the contrast's seeds detect with 80% power (``detectable``);
- the seeds (pairs) needed for the effect the spec declares (``analysis.min_effect``).

The level. The primary family is tested with Holm's step-down adjustment; with ``m``
contrasts its strictest level is ``alpha / m``. A contrast whose p-value is below
``alpha / m`` is rejected whatever the others' p-values are (every earlier step passes too),
so power at ``alpha / m`` is the power each contrast has on its own; Holm's later steps can
only add to it. The figures are therefore conservative, never optimistic.

The sample SD of the differences is itself an estimate from ``n`` seeds; with five it is
uncertain by about a third, so the seeds needed are a planning figure, not a guarantee.

Pure: no MLflow, no Ray; scipy.special only (as :mod:`sweeps.report.statistics`).
"""

from __future__ import annotations

import math
import statistics as pystats
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scipy.special import nctdtr, ndtr, stdtrit

from sweeps.report.contrasts import SIGNIFICANCE  # the family's level
from sweeps.report.statistics import MIN_PAIRS_FOR_CLAIM
from sweeps.spec.sections import POWER_TARGET

__all__ = ["LEVEL_WORDS", "MAX_SEEDS", "POWER", "detectable_effect",
           "extend_command", "holm_level", "paired_power", "power_entry", "power_figures",
           "power_section", "seeds_needed", "unused_seeds"]

POWER = POWER_TARGET
MAX_SEEDS = 100_000
"""Beyond this many seeds the report says "more than" instead of a number."""
LEVEL_WORDS = ("the strictest Holm level, {significance:g} / {m} = {level:.3g}: a contrast whose "
               "p-value is below it is rejected whatever the other contrasts' p-values are, so "
               "it is the power each contrast has on its own (Holm's later steps only add to it)")


def holm_level(family_size: int, significance: float = SIGNIFICANCE) -> float:
    """The strictest level of Holm's adjustment over ``family_size`` tests (at least one)."""
    return significance / max(1, family_size)


def paired_power(effect: float, sd: float, n: int, level: float) -> float:
    """Power of the two-sided paired t test at ``level`` with ``n`` pairs whose differences
    have standard deviation ``sd``, when the true mean difference is ``effect``.

    Raises:
        ValueError: fewer than 2 pairs (no t test), a negative SD or a level outside (0, 1).
    """
    if n < 2:
        raise ValueError(f"a paired t test needs at least 2 pairs, got {n}")
    if sd < 0 or not 0 < level < 1:
        raise ValueError(f"sd must be >= 0 and level in (0, 1), got sd={sd}, level={level}")
    if sd == 0:  # every seed gives the same difference: any nonzero one is seen for sure
        return 1.0 if effect != 0 else level
    df = n - 1
    critical = float(stdtrit(df, 1 - level / 2))
    shift = abs(effect) / sd * math.sqrt(n)
    # P(T > c) + P(T < -c) for T noncentral t(df, shift).
    lower = float(nctdtr(df, shift, -critical))
    if not math.isfinite(lower):  # scipy gives NaN far out in that tail; it is below P(T < 0) = Phi(-shift)
        lower = float(ndtr(-shift))
    return float(1 - nctdtr(df, shift, critical) + lower)


def detectable_effect(sd: float, n: int, level: float, power: float = POWER) -> float:
    """The smallest mean difference the test detects with ``power`` (bisection on the effect:
    power rises with it), in the metric's units."""
    if sd == 0:
        return 0.0
    low, high = 0.0, sd
    while paired_power(high, sd, n, level) < power:
        low, high = high, 2 * high
    for _ in range(100):
        middle = (low + high) / 2
        if paired_power(middle, sd, n, level) < power:
            low = middle
        else:
            high = middle
        if high - low <= 1e-9 * high:
            break
    return high


def seeds_needed(effect: float, sd: float, level: float, power: float = POWER) -> int | None:
    """The fewest pairs (at least MIN_PAIRS_FOR_CLAIM, below which the report tests nothing)
    whose test detects ``effect`` with ``power``; None beyond :data:`MAX_SEEDS`."""
    if effect <= 0:
        raise ValueError(f"the effect must be > 0, got {effect}")
    if paired_power(effect, sd, MIN_PAIRS_FOR_CLAIM, level) >= power:
        return MIN_PAIRS_FOR_CLAIM
    low, high = MIN_PAIRS_FOR_CLAIM, 2 * MIN_PAIRS_FOR_CLAIM  # power(low) < power
    while paired_power(effect, sd, high, level) < power:
        if high >= MAX_SEEDS:
            return None
        low, high = high, min(2 * high, MAX_SEEDS)
    while high - low > 1:
        middle = (low + high) // 2
        if paired_power(effect, sd, middle, level) < power:
            low = middle
        else:
            high = middle
    return high


def power_figures(sd: float | None, n: int, level: float, min_effect: float | None,
                  power: float = POWER) -> dict[str, Any]:
    """The power figures of a contrast with ``n`` pairs whose differences have SD ``sd``."""
    entry: dict[str, Any] = {"n_pairs": n, "paired_sd": sd, "level": level, "power": power,
                             "detectable": None, "min_effect": min_effect,
                             "power_at_min_effect": None, "seeds_needed": None,
                             "seeds_to_add": None, "note": None}
    if sd is None or n < 2:
        entry["note"] = f"{n} pair(s): no paired t test (2 needed, {MIN_PAIRS_FOR_CLAIM} for a claim)"
        return entry
    entry["detectable"] = detectable_effect(sd, n, level, power)
    if min_effect is not None:
        entry["power_at_min_effect"] = paired_power(min_effect, sd, n, level)
        needed = seeds_needed(min_effect, sd, level, power)
        entry["seeds_needed"] = needed
        entry["seeds_to_add"] = None if needed is None else max(0, needed - n)
        if needed is None:
            entry["note"] = f"more than {MAX_SEEDS} seeds needed"
    return entry


def power_entry(diffs: Sequence[float], level: float, min_effect: float | None,
                power: float = POWER) -> dict[str, Any]:
    """The power figures of one contrast from its per-seed differences (sample SD)."""
    sd = pystats.stdev(diffs) if len(diffs) >= 2 else None
    return power_figures(sd, len(diffs), level, min_effect, power)


def unused_seeds(have: Iterable[int], count: int) -> list[int]:
    """The ``count`` smallest non-negative seeds not in ``have``."""
    taken, out, seed = set(have), [], 0
    while len(out) < count:
        if seed not in taken:
            out.append(seed)
        seed += 1
    return out


def seed_list_text(seeds: Iterable[int]) -> str:
    """Seeds as ``ksweep extend --seeds`` takes them: runs of three or more as ``a-b``
    (``[5, 6, 7, 9]`` -> ``5-7,9``)."""
    runs: list[list[int]] = []
    for seed in sorted(set(seeds)):
        if runs and runs[-1][-1] + 1 == seed:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)) for run in runs)


def extend_command(sweep_id: str, have: Iterable[int], count: int) -> str:
    """``ksweep extend ID --seeds ...`` adding ``count`` seeds the sweep has not run."""
    return f"ksweep extend {sweep_id} --seeds {seed_list_text(unused_seeds(have, count))}"


def _label(contrast: Mapping[str, Any]) -> dict[str, Any]:
    return {key: contrast.get(key) for key in ("contrast", "loss_stack", "baseline", "alpha",
                                                "model", "beta", "free_bits", "kind", "metric")}


def power_section(contrasts: Sequence[Mapping[str, Any]], min_effect: float | None,
                  sweeps: Mapping[str, Sequence[int]], extendable: bool = True,
                  significance: float = SIGNIFICANCE, power: float = POWER) -> dict[str, Any]:
    """report.json's ``power``: each primary contrast's figures, and what gets the family there.

    Args:
        contrasts: the report's contrasts (only ``family == "primary"`` ones are read).
        min_effect: the effect the spec declares (``analysis.min_effect``), or None.
        sweeps: sweep id -> the seeds it has run (one sweep, or each sweep compared): the
            command adds seeds none of them has, to each.
        extendable: whether ``ksweep extend`` can add seeds (grid and random sweeps).
    """
    primary = [c for c in contrasts if c.get("family") == "primary"]
    family_size = sum(c.get("p_value") is not None for c in primary) or len(primary)
    level = holm_level(family_size, significance)
    entries = [{**_label(c), **power_entry(c.get("diffs") or [], level, min_effect, power)}
               for c in primary]
    needed = [e["seeds_needed"] for e in entries]
    to_add = max((e["seeds_to_add"] or 0 for e in entries), default=0)
    section: dict[str, Any] = {
        "power": power, "significance": significance, "family_size": family_size,
        "level": level, "level_why": LEVEL_WORDS.format(significance=significance,
                                                        m=family_size, level=level),
        "min_effect": min_effect, "entries": entries,
        "seeds_needed": None if not needed or None in needed else max(needed),
        "extend": [], "advice": None,
    }
    if min_effect is None or not entries:
        return section
    if None in needed:
        section["advice"] = (f"a contrast needs more than {MAX_SEEDS} seeds (or has fewer than 2 "
                             "pairs): more seeds will not get there; lower the noise or declare a "
                             "larger analysis.min_effect")
    elif to_add and extendable:
        have = sorted({s for seeds in sweeps.values() for s in seeds})
        section["extend"] = [extend_command(sweep_id, have, to_add) for sweep_id in sweeps]
        section["advice"] = (f"{to_add} more seed(s) give every primary contrast {power:.0%} power "
                             f"for {min_effect:g}; the family and the predictions stay as first "
                             "declared, and the grown contrasts are marked 'extended' (seeds added "
                             "after looking)")
    elif to_add:
        section["advice"] = (f"{to_add} more seed(s) are needed, and this sweep cannot be extended "
                             "(Optuna or ASHA): submit a new sweep with "
                             f"{section['seeds_needed']} seeds")
    return section

"""Short codes for the report's verdicts, with the legend lines that say what they mean.

report.md spells each verdict out in words ("in use (2 of 3 seeds in use); AMI at chance"); a
terminal table at 80 columns has room for a word or two, so ``ksweep report`` prints a code
(``used 2/3``, ``chance 3/3``, ``off 0/3``; ``higher``, ``n.s.*``) and one legend line under
the table. The codes read the fields the words are built from, never the words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweeps.report.contrasts import SIGNIFICANCE
from sweeps.report.latent_use import AT_CHANCE, COLLAPSED
from sweeps.report.rate_text import unpriced_words
from sweeps.report.statistics import MIN_PAIRS_FOR_CLAIM

__all__ = ["claim_code", "claim_legend", "latent_code", "latent_legend", "latent_words"]


def latent_words(row: Mapping[str, Any]) -> str:
    """A latent-use row's verdict in words (report.md's last column)."""
    if row["in_use"] is None:
        return "-"
    state = "in use" if row["in_use"] else "collapsed"
    chance = "; AMI at chance" if row.get("at_chance") else ""
    return f"{state} ({row['seeds_in_use']} of {row['seeds']} seeds in use){chance}{unpriced_words(row)}"


def latent_code(row: Mapping[str, Any]) -> str:
    """A latent-use row's verdict as a code: ``used k/n``, ``chance k/n`` or ``off k/n`` (k of
    the n seeds have I(x; z) at or above the threshold), ``-`` when it logged no I(x; z)."""
    if row["in_use"] is None:
        return "-"
    seeds = f"{row['seeds_in_use']}/{row['seeds']}"
    free = " free" if row.get("information_priced") is False else ""  # trained with the credit
    if not row["in_use"]:
        return f"off {seeds}{free}"
    return f"{'chance' if row.get('at_chance') else 'used'} {seeds}{free}"


def latent_legend(threshold: float) -> str:
    """The legend line under the terminal's latent-use table."""
    return (f"latent: used k/n = mean I(x; z) >= {threshold:g} nats, k of n seeds at or above "
            "it; chance = used, but the AMI interval contains 0; off = collapsed (mean I(x; z) "
            f"< {threshold:g} nats); free = trained with the mutual-information credit: "
            "information unpriced; --format md says it in words")


def claim_code(entry: Mapping[str, Any]) -> str:
    """A contrast's claim as a code: ``higher``/``lower`` (significant, Holm), ``n.s.`` (``n.s.*``
    where the unadjusted interval excludes 0), ``both off``, ``both chance``, ``unused``,
    ``explor.``, ``no claim`` or ``identical``; ``!`` appended against a constant-latent
    baseline. The words (``claim``) are built from the same fields
    (:func:`sweeps.report.contrasts.claim_words`)."""
    if entry.get("identical_objective"):
        return "identical"
    if entry["n_pairs"] < MIN_PAIRS_FOR_CLAIM:
        return "no claim"
    if entry.get("latent_gated"):
        sides = {entry.get("treated_latent"), entry.get("baseline_latent")}
        return ("both off" if sides == {COLLAPSED} else "both chance" if sides == {AT_CHANCE}
                else "unused")
    flag = "!" if entry.get("baseline_constant") else ""
    if entry["family"] != "primary":
        return "explor." + flag
    p = entry.get("p_adjusted")
    if p is not None and p < SIGNIFICANCE:
        return ("higher" if entry["mean_diff"] > 0 else "lower") + flag
    low, high = entry.get("ci_low"), entry.get("ci_high")
    excludes = low is not None and high is not None and (low > 0 or high < 0)
    return ("n.s.*" if excludes else "n.s.") + flag


def claim_legend() -> str:
    """The legend line under the terminal's contrasts table."""
    return (f"verdict: higher/lower = Holm p < {SIGNIFICANCE:g}; n.s. = not significant "
            "(n.s.*: the unadjusted 95% interval excludes 0); both off / both chance / unused = "
            "neither side's latent is in use; ! = against a constant latent; --format md says "
            "it in words")

"""Is each cell's latent in use, and where do a contrast's two sides stand: collapsed, at chance?

A cell's latent is in use when its mean test I(x; z) reaches ``analysis.latent_in_use_nats``:
I(x; z) is what the decoder can take from z, while an argmax label can carry a class with z
carrying nothing, so NMI alone never says the latent is used. A contrast whose two sides are
both collapsed or at chance says so instead of "higher" or "lower" (:func:`gate_words`), and a
contrast against a constant-latent baseline is flagged. Pure functions of the report's cells.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.report.readout_table import ALL_KINDS
from sweeps.report.statistics import mean_interval, metric_range
from workers.contract import (
    ACTIVE_UNITS,
    EPOCHS_TO_NMI,
    KL,
    LATENT_AMI,
    LATENT_NMI_SHUFFLED,
    MUTUAL_INFO,
    NMI_AUC,
    USED_CATEGORIES,
)

__all__ = ["AT_CHANCE", "COLLAPSED", "ESTIMATORS", "IN_USE", "LATENT_READOUTS", "USE_READOUTS",
           "constant_baseline_words", "contrast_latent", "gate_words", "latent_limitations",
           "latent_use", "side_state"]

LATENT_NMI = "latent_nmi"
# The read-outs of the latent-use table, which the report reads whatever analysis.metrics lists.
USE_READOUTS: tuple[str, ...] = (KL, MUTUAL_INFO, ACTIVE_UNITS, USED_CATEGORIES, LATENT_AMI,
                                 LATENT_NMI, LATENT_NMI_SHUFFLED)
# Read-outs of the latent itself: a contrast on one of them is gated (a loss or the ELBO is not:
# two collapsed decoders can still differ).
LATENT_READOUTS = frozenset({LATENT_NMI, "latent_ari", LATENT_AMI, LATENT_NMI_SHUFFLED, "mi_zs",
                             NMI_AUC, EPOCHS_TO_NMI, MUTUAL_INFO, ACTIVE_UNITS, USED_CATEGORIES})
IN_USE, COLLAPSED, AT_CHANCE = "in use", "collapsed", "at chance"
ESTIMATORS = {
    "discrete": "exact: H(mean_n q(z|x_n)) - mean_n H(q(z|x_n)), in [0, log K]",
    "continuous": "paired mixture estimate (He et al. 2019): mean_n [log q(z_n|x_n) - log "
                  "q_agg(z_n)], q_agg the uniform mixture of the split's N posteriors, one "
                  "seeded z_n ~ q(z|x_n) per example; in [0, log N], exactly 0 when no "
                  "posterior depends on x",
}
_CONFIG = ("alpha", "loss_stack", "model", "beta", "free_bits", "target_rate")


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def side_state(mutual_info: Sequence[float | None], ami: Sequence[float | None],
               threshold: float) -> dict[str, Any]:
    """One side of a contrast over its seeds: ``latent`` (in use, collapsed, at chance, or None
    when it logged neither I(x; z) nor AMI), its mean I(x; z) and AMI, and whether it is
    collapsed in every seed (``collapsed_every_seed``).

    Collapsed: its mean I(x; z) over the contrast's seeds is under the threshold; at chance: the
    t interval of its AMI over those seeds contains 0."""
    info, adjusted = _finite(mutual_info), _finite(ami)
    mean_info = sum(info) / len(info) if info else None
    interval = mean_interval(adjusted, metric_range(LATENT_AMI))
    chance = interval.ci_low is not None and interval.ci_low <= 0 <= interval.ci_high
    if mean_info is not None and mean_info < threshold:
        state: str | None = COLLAPSED
    elif chance:
        state = AT_CHANCE
    else:
        state = IN_USE if info or adjusted else None
    return {"latent": state, MUTUAL_INFO: mean_info, LATENT_AMI: interval.mean,
            "collapsed_every_seed": bool(info) and all(v < threshold for v in info)}


def contrast_latent(metric: str, treated: Mapping[str, Any], baseline: Mapping[str, Any],
                    baseline_values: Sequence[float | None], threshold: float) -> dict[str, Any]:
    """A contrast's latent-use keys (flat, one column each in the contrasts table): each side's
    state, mean I(x; z) and AMI; ``latent_gated`` (a latent read-out with both sides collapsed
    or at chance); ``baseline_constant`` (collapsed in every seed, one value of ``metric`` in
    every seed)."""
    values = _finite(baseline_values)
    latent = metric in LATENT_READOUTS
    gated = latent and treated["latent"] in (COLLAPSED, AT_CHANCE) and baseline["latent"] in (COLLAPSED, AT_CHANCE)
    constant = (latent and baseline["collapsed_every_seed"] and len(values) >= 2
                and max(values) == min(values))
    sides = {f"{side}_{key}": record[key] for side, record in (("treated", treated), ("baseline", baseline))
             for key in ("latent", MUTUAL_INFO, LATENT_AMI)}
    return {"latent_in_use_nats": threshold, **sides, "latent_gated": gated, "baseline_constant": constant}


def gate_words(entry: Mapping[str, Any]) -> str | None:
    """What a gated contrast says instead of higher/lower (None when not gated)."""
    if not entry.get("latent_gated"):
        return None
    treated, baseline = entry["treated_latent"], entry["baseline_latent"]
    threshold = f"{entry['latent_in_use_nats']:g}"
    if treated == baseline == COLLAPSED:
        return f"both collapsed (mean test I(x; z) < {threshold} nats on each side): no difference in the latent"
    if treated == baseline == AT_CHANCE:
        return "both at chance (AMI interval contains 0 on each side): no recovery to compare"
    return (f"neither side is in use: {entry['loss_stack']} {treated}, {entry['baseline']} {baseline} "
            f"(collapsed: I(x; z) < {threshold} nats; at chance: AMI interval contains 0)")


def constant_baseline_words(entry: Mapping[str, Any]) -> str:
    """The flag on a contrast against a constant-latent baseline ('' when it is not one): a
    baseline collapsed in every seed gives the contrast's metric the same value in every seed,
    and against it any assignment that is not constant "wins" a paired test."""
    if not entry.get("baseline_constant"):
        return ""
    return (f"; flagged: {entry['baseline']}'s latent is constant (I(x; z) < "
            f"{entry['latent_in_use_nats']:g} nats and the same value in every seed), so any "
            "assignment that varies differs from it")


def latent_use(cells: Sequence[Mapping[str, Any]], split: str, threshold: float) -> dict[str, Any]:
    """Per configuration (all kinds): the use read-outs on ``split`` and whether the latent is in
    use (mean I(x; z) >= ``threshold``; None where the cell logged no I(x; z)), with the seeds in use."""
    rows: dict[tuple, dict[str, Any]] = {}
    for cell in cells:
        if cell["split"] != split or cell["kind"] != ALL_KINDS or cell["metric"] not in USE_READOUTS:
            continue
        config = tuple(cell.get(key) for key in _CONFIG)
        row = rows.setdefault(config, {**dict(zip(_CONFIG, config, strict=True)),
                                       "beta_effective": cell.get("beta_effective"),
                                       "beta_elbo": cell.get("beta_elbo")})
        row[cell["metric"]] = {key: cell[key] for key in ("mean", "ci_low", "ci_high", "n")}
        if cell["metric"] == MUTUAL_INFO:
            info = _finite(cell["values"])
            row["seeds_in_use"], row["seeds"] = sum(v >= threshold for v in info), len(info)
            row["in_use"] = None if cell["mean"] is None else cell["mean"] >= threshold
        if cell["metric"] == LATENT_AMI:
            row["at_chance"] = cell["ci_low"] is not None and cell["ci_low"] <= 0 <= cell["ci_high"]
    for row in rows.values():
        row.setdefault("in_use", None)
    return {"split": split, "in_use_nats": threshold, "estimators": ESTIMATORS,
            "cells": list(rows.values())}


def latent_limitations(cells: Sequence[Mapping[str, Any]], use: Mapping[str, Any]) -> list[str]:
    """The report's words on chance-level NMI and on collapsed latents (the latent-use table)."""
    split, threshold = use["split"], use["in_use_nats"]
    own = {(tuple(c.get(k) for k in _CONFIG), c["metric"]): c for c in cells
           if c["split"] == split and c["kind"] == ALL_KINDS and c["mean"] is not None
           and math.isfinite(c["mean"])}
    words = []
    nmi = [(c, own.get((config, LATENT_NMI_SHUFFLED))) for (config, metric), c in own.items()
           if metric == LATENT_NMI]
    nmi = [(c, chance) for c, chance in nmi if chance is not None]
    if nmi:
        at_chance = [c for c, chance in nmi if chance["ci_high"] is not None and c["mean"] <= chance["ci_high"]]
        words.append(f"{len(at_chance)} of {len(nmi)} {split} latent_nmi cell(s) are at chance level "
                     "(mean NMI within the interval of the NMI against shuffled labels): read "
                     f"{LATENT_AMI} beside them; a contrast between chance-level cells is not "
                     "latent recovery.")
    known = [row for row in use["cells"] if row["in_use"] is not None]
    collapsed = [row for row in known if not row["in_use"]]
    if collapsed:
        words.append(f"{len(collapsed)} of {len(known)} cell(s) have a collapsed latent (mean {split} "
                     f"I(x; z) < {threshold:g} nats, analysis.latent_in_use_nats): the decoder takes "
                     "(almost) nothing from z there, whatever the KL or an argmax NMI reads; a contrast "
                     "on a latent read-out between two such cells says 'both collapsed'.")
    return words

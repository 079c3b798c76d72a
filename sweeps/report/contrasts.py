"""Paired contrasts between stacks at matched effective beta, the caveat contrasts, Holm.

How rows are matched, which contrasts form the primary family and how each side's latent use
gates the wording: on :func:`build_contrasts`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sweeps.report.latent_use import (
    constant_baseline_words,
    contrast_latent,
    gate_words,
    side_state,
)
from sweeps.report.readout_table import ALL_KINDS, RowResult
from sweeps.report.statistics import (
    MIN_PAIRS_FOR_CLAIM,
    holm,
    interpolate_log,
    metric_range,
    paired_difference,
)
from sweeps.spec import SweepSpec
from workers.contract import LATENT_AMI, MUTUAL_INFO

__all__ = ["SIGNIFICANCE", "build_contrasts", "claim_words", "default_pairs"]

SIGNIFICANCE = 0.05
EXTRA_CONTRAST_METRICS = ("nmi_auc", "latent_ari")
# The caveat's other side: where z spends its capacity. R~ - R_tok per kind (and the
# interaction) on the rate E[KL] and on the estimate of I(z; s), always exploratory.
CAVEAT_EXTRA_METRICS = ("kl", "mi_zs")


def default_pairs(spec: SweepSpec) -> list[tuple[str, str]]:
    """(stack, baseline) pairs: the spec's, else every stack against uniform (when swept)."""
    if spec.analysis.contrasts is not None:
        return [(c.stack, c.baseline) for c in spec.analysis.contrasts]
    labels = spec.stack_labels()
    if "uniform" not in labels:
        return []
    return [(label, "uniform") for label in labels if label != "uniform"]


Curves = dict[tuple, dict[int, list[tuple[float, float | None]]]]


class Point(NamedTuple):
    """One row's value at one seed, and the beta it is matched at (build_contrasts)."""

    match: float | None
    value: float | None
    trial_id: str
    effective: float | None
    elbo: float | None


def _index(rows: Sequence[RowResult], split: str) -> tuple[dict, Curves, str]:
    """(stack, alpha, model, free_bits, beta, kind, metric) -> seed -> Point,
    (stack, alpha, model, free_bits, kind, metric) -> seed -> [(matched beta, value)] curves,
    and the beta they are matched on, in words."""
    points: dict[tuple, dict[int, Point]] = defaultdict(dict)
    curves: Curves = defaultdict(lambda: defaultdict(list))
    in_elbo_units = all(row.beta_elbo is not None for row in rows if row.beta_effective is not None)
    for row in rows:
        match = row.beta_elbo if in_elbo_units else row.beta_effective
        for (row_split, kind, metric), value in row.values.items():
            if row_split != split:
                continue
            base = (row.loss_stack, row.alpha, row.model, row.free_bits)
            points[(*base, row.beta, kind, metric)][row.seed] = Point(
                match, value, row.trial_id, row.beta_effective, row.beta_elbo)
            if match is not None and match > 0:
                curves[(*base, kind, metric)][row.seed].append((match, value))
    return points, curves, "beta in ELBO units" if in_elbo_units else "effective beta"


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _matched(curve: dict[int, list], baseline: dict[int, tuple]):
    """Per seed: the treated value at the baseline's effective beta, the baseline value."""
    treated, base_values, n_unmatched, interpolated = {}, {}, 0, False
    for seed, (x, value, *_) in baseline.items():
        points = curve.get(seed, [])
        xs = [p[0] for p in points]
        exact = x is not None and any(abs(px / x - 1) <= 1e-9 for px in xs)
        if not exact and not (x is not None and xs and min(xs) < x < max(xs)):
            n_unmatched += 1
            continue
        # None when a neighbouring value is NaN: paired_difference counts it in n_nan.
        treated[seed] = interpolate_log(xs, [p[1] for p in points], x)
        base_values[seed] = value
        interpolated |= not exact
    return treated, base_values, n_unmatched, "interpolated (log beta)" if interpolated else "exact"


def _entry(key: dict[str, Any], treated: dict, baseline: dict, metric: str) -> dict[str, Any]:
    diff = paired_difference(treated, baseline, metric_range(metric))
    return {**key, "metric": metric, "mean_diff": diff.mean_diff, "ci_low": diff.ci_low,
            "ci_high": diff.ci_high, "p_value": diff.p_value, "p_adjusted": None,
            "n_pairs": diff.n_pairs, "n_nan": diff.n_nan, "seeds": diff.seeds,
            "diffs": diff.diffs}


def _latent(spec: SweepSpec, entry: dict[str, Any], points, curves, stack: str, baseline: str,
            base_values: dict[int, float | None], matched: bool) -> dict[str, Any]:
    """The contrast's latent-use keys over its paired seeds (all when it has none; build_contrasts)."""
    alpha, model, free_bits, beta = entry["alpha"], entry["model"], entry["free_bits"], entry["beta"]
    seeds = set(entry["seeds"]) or set(base_values)
    threshold = spec.analysis.latent_in_use_nats
    sides: dict[str, dict[str, dict[int, float | None]]] = {"treated": {}, "baseline": {}}
    for metric in (MUTUAL_INFO, LATENT_AMI):
        base = points.get((baseline, alpha, model, free_bits, beta, ALL_KINDS, metric), {})
        if matched:
            treated = _matched(curves.get((stack, alpha, model, free_bits, ALL_KINDS, metric), {}), base)[0]
        else:
            twin = points.get((stack, alpha, model, free_bits, beta, ALL_KINDS, metric), {})
            treated = {seed: point.value for seed, point in twin.items()}
        sides["treated"][metric] = treated
        sides["baseline"][metric] = {seed: point.value for seed, point in base.items()}

    def state(side: str) -> dict[str, Any]:
        values = sides[side]
        return side_state([values[MUTUAL_INFO].get(s) for s in sorted(seeds) if s in values[MUTUAL_INFO]],
                          [values[LATENT_AMI].get(s) for s in sorted(seeds) if s in values[LATENT_AMI]],
                          threshold)

    return contrast_latent(entry["metric"], state("treated"), state("baseline"),
                           [base_values.get(s) for s in sorted(seeds) if s in base_values], threshold)


def _declared(spec, stack: str, baseline: str):
    """The spec's ContrastSpec for (stack, baseline), None for a default pair."""
    return next((c for c in spec.analysis.contrasts or () if (c.stack, c.baseline) == (stack, baseline)),
                None)


def _stack_contrasts(spec, points, curves, split, metrics, matched_on: str) -> list[dict[str, Any]]:
    out = []
    for stack, baseline in default_pairs(spec):
        declared = _declared(spec, stack, baseline)
        for key, base in points.items():
            b_stack, alpha, model, free_bits, beta, kind, metric = key
            if b_stack != baseline or metric not in metrics:
                continue
            curve = curves.get((stack, alpha, model, free_bits, kind, metric), {})
            treated, base_values, n_unmatched, how = _matched(curve, base)
            twin = points.get((stack, alpha, model, free_bits, beta, kind, metric), {})
            identical = bool(twin) and {s: p.trial_id for s, p in twin.items()} == {
                s: p.trial_id for s, p in base.items()}
            entry = _entry({
                "contrast": "stack", "alpha": alpha, "loss_stack": stack, "model": model,
                "baseline": baseline, "kind": kind, "split": split, "beta": beta,
                "free_bits": free_bits,
                "beta_effective": _mean([p.effective for p in base.values()]),
                "beta_elbo": _mean([p.elbo for p in base.values()]),
                "beta_matching": how if treated else "unmatched", "n_unmatched": n_unmatched,
                "matched_on": matched_on, "identical_objective": identical,
                "declared_primary": declared is None or declared.primary,
                "predicted": None if declared is None or metric != spec.analysis.metric else declared.predicted,
            }, treated, base_values, metric)
            entry.update(_latent(spec, entry, points, curves, stack, baseline, base_values,
                                 matched=True))
            out.append(entry)
    return out


def _caveat_contrasts(spec, points, split) -> list[dict[str, Any]]:
    """R~ - R_tok per kind at the same beta (both undivided: matched exactly), and the
    interaction (prefix - private) paired by seed. alpha 0 is skipped: both are uniform."""
    treated, control = spec.analysis.caveat_treated, spec.analysis.caveat_control
    labels = spec.stack_labels()
    if treated not in labels or control not in labels:
        return []
    metrics = (spec.analysis.metric, *CAVEAT_EXTRA_METRICS)
    out = []
    by_config: dict[tuple, dict[str, dict[int, float | None]]] = defaultdict(dict)
    for key, base in points.items():
        stack, alpha, model, free_bits, beta, kind, metric = key
        if stack != control or metric not in metrics or alpha == 0:
            continue
        other = points.get((treated, alpha, model, free_bits, beta, kind, metric), {})
        t_values = {seed: p.value for seed, p in other.items()}
        c_values = {seed: p.value for seed, p in base.items()}
        common = {"alpha": alpha, "loss_stack": treated, "model": model, "baseline": control,
                  "split": split, "beta": beta, "free_bits": free_bits,
                  "beta_elbo": _mean([p.elbo for p in base.values()]),
                  "beta_matching": "exact (same beta; both stacks undivided)", "n_unmatched": 0,
                  "identical_objective": False}
        entry = _entry({"contrast": "caveat", "kind": kind, **common}, t_values, c_values, metric)
        entry.update(_latent(spec, entry, points, {}, treated, control, c_values, matched=False))
        out.append(entry)
        diffs = {seed: None if t_values.get(seed) is None or c_values.get(seed) is None
                 else t_values[seed] - c_values[seed] for seed in set(t_values) & set(c_values)}
        by_config[(alpha, model, free_bits, beta, metric)][kind] = diffs
        by_config[(alpha, model, free_bits, beta, metric)]["_common"] = common
    for config, kinds in by_config.items():
        if "prefix" in kinds and "private" in kinds:
            out.append(_entry({"contrast": "interaction", "kind": "prefix-private",
                               **kinds["_common"]}, kinds["prefix"], kinds["private"], config[-1]))
    return out


def _assign_families(spec: SweepSpec, contrasts: list[dict[str, Any]],
                     eligible: Callable[[dict[str, Any]], bool] | None = None) -> None:
    metric = spec.analysis.metric
    for entry in contrasts:
        if spec.analysis.primary == "caveat_across":  # one side of sweeps.report.across
            primary = (entry["metric"] == metric and entry["contrast"] == "caveat"
                       and entry["kind"] == ALL_KINDS)
        elif spec.analysis.primary == "caveat":
            primary = entry["metric"] == metric and (entry["contrast"] == "interaction" or (
                entry["contrast"] == "caveat" and entry["kind"] in ("prefix", "private")))
        else:
            primary = (entry["contrast"] == "stack" and entry["kind"] == ALL_KINDS
                       and entry["metric"] == metric and not entry["identical_objective"]
                       and entry.get("declared_primary", True))
        # A grown sweep's primary family stays as first declared (sweeps.report.growth).
        primary = primary and (eligible is None or eligible(entry))
        entry["family"] = "primary" if primary else "exploratory"
    family = [e for e in contrasts if e["family"] == "primary"]
    for entry, adjusted in zip(family, holm([e["p_value"] for e in family]), strict=True):
        entry["p_adjusted"] = adjusted
    for entry in contrasts:
        entry["claim"] = claim_words(entry)


def claim_words(entry: dict[str, Any]) -> str:
    """What a contrast supports, in words (next to its numbers in report.md)."""
    if entry.get("identical_objective"):
        return "identical objective (one shared trial): the difference is 0 by construction"
    if entry["n_pairs"] < MIN_PAIRS_FOR_CLAIM:
        reason = (f"no matched {entry.get('matched_on', 'effective beta')}"
                  if entry.get("beta_matching") == "unmatched"
                  else f"{entry['n_pairs']} seed pair(s) < {MIN_PAIRS_FOR_CLAIM}")
        return f"no claim: {reason}"
    gated = gate_words(entry)
    if gated is not None:  # both sides collapsed or at chance: never "higher" or "lower"
        return gated
    flag = constant_baseline_words(entry)
    predicted = entry.get("predicted")
    if entry["family"] == "exploratory":
        return ("exploratory: not a claim (no multiplicity adjustment)" + flag
                + ("" if predicted is None else f"; predicted {predicted}"))
    if entry["p_adjusted"] is not None and entry["p_adjusted"] < SIGNIFICANCE:
        direction = "higher" if entry["mean_diff"] > 0 else "lower"
        verdict = "" if predicted is None else (
            "; as predicted" if predicted == direction else f"; against the prediction ({predicted})")
        return f"{direction} than {entry['baseline']} (Holm p = {entry['p_adjusted']:.3g}{verdict}){flag}"
    flag += "" if predicted is None else f"; predicted {predicted}"
    # The interval is unadjusted: it can exclude 0 while Holm's p does not reach significance.
    low, high = entry.get("ci_low"), entry.get("ci_high")
    excludes = low is not None and high is not None and (low > 0 or high < 0)
    why = "the unadjusted 95% interval excludes 0" if excludes else "interval includes 0"
    return f"no significant difference (Holm p = {entry['p_adjusted']:.3g}; {why}){flag}"


def build_contrasts(spec: SweepSpec, rows: Sequence[RowResult], split: str,
                    eligible: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """Every stack contrast and caveat contrast on ``split``, with families and Holm applied
    (``eligible``: which contrasts may be primary at all; None: any).

    Matching. Stacks are compared at matched *effective* beta (:mod:`objectives.units`),
    never at one shared nominal beta. For each baseline row (alpha, model, free bits, beta)
    and seed, the treated stack's value is read at the baseline's effective beta by linear
    interpolation in log(effective beta) between the treated stack's own grid points of the
    same alpha, model, free bits and seed (:func:`sweeps.report.statistics.interpolate_log`). An exact
    grid point is used as is (``beta_matching = exact``: e.g. two undivided stacks at one beta);
    a baseline effective beta outside the treated stack's range is not matched (no
    extrapolation) and that seed is counted in ``n_unmatched``. Where every row knows its beta
    in ELBO units (trials log their train split's mean target length), the matching reads that
    instead: it is effective beta times a factor every stack shares at one seed (the mean
    length, or 1 under the per-token KL), so it matches exactly as before between stacks of one
    KL scale, and correctly between a per-example and a per-token KL.

    Families. The spec's ``analysis.primary`` names the primary family: the stack contrasts on
    ``analysis.metric`` over all examples (default), or the caveat family (R~ - R_tok on the
    ``prefix`` and ``private`` kinds and their interaction, every alpha > 0, on
    ``analysis.metric``; the same contrasts on the rate ``kl`` and on ``mi_zs`` are computed
    beside them, always exploratory). Holm adjusts
    within it; every other contrast is exploratory (its ``p_value`` is unadjusted and it makes
    no claim).

    Latent use. Every stack and caveat contrast carries each side's state over the contrast's
    seeds (``treated_latent``, ``baseline_latent``: in use, collapsed or at chance, with their mean
    I(x; z) and AMI; :mod:`sweeps.report.latent_use`), read on test I(x; z) and AMI at the
    contrast's beta (the treated side matched as its metric is). A contrast on a latent read-out
    whose sides are both collapsed or at chance says which instead of "higher"/"lower"
    (``latent_gated``); one against a constant-latent baseline is flagged (``baseline_constant``).
    """
    points, curves, matched_on = _index(rows, split)
    metrics = {spec.analysis.metric, *EXTRA_CONTRAST_METRICS}
    contrasts = _stack_contrasts(spec, points, curves, split, metrics, matched_on)
    contrasts += _caveat_contrasts(spec, points, split)
    _assign_families(spec, contrasts, eligible)
    return contrasts

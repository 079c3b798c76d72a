"""Power before a sweep runs: a spec's primary family read against a pilot sweep's report.

``ksweep validate SPEC --pilot ID`` answers, before anything runs, what the report's power
section (:mod:`sweeps.report.power`) would: for each primary contrast the spec plans, the
paired SD the pilot measured for it, the smallest effect the spec's seeds detect at 80% power
at the strictest Holm level of the spec's family, and the seeds ``analysis.min_effect`` needs.

A planned contrast takes the SD of the pilot's contrast with the same stack, baseline, alpha,
model, kind and metric (and beta or free bits where the spec sweeps them), primary or not in
the pilot; a contrast the pilot did not run takes the largest SD among the pilot's primary
contrasts, and says so (the conservative guess). Torch-free: the CLI and the API call it.
"""

from __future__ import annotations

import statistics as pystats
from collections.abc import Mapping
from typing import Any

from sweeps.plan.identity import objective_key
from sweeps.report.contrasts import SIGNIFICANCE, default_pairs
from sweeps.report.power import LEVEL_WORDS, POWER, holm_level, power_figures
from sweeps.spec import SweepSpec

__all__ = ["PilotMismatch", "pilot_lines", "pilot_power", "planned_contrasts"]

_MATCHED = ("loss_stack", "baseline", "alpha", "model", "kind", "metric")


class PilotMismatch(ValueError):
    """The pilot's report cannot stand for the spec (another metric, no paired seeds)."""


def _primary_pairs(spec: SweepSpec) -> list[tuple[str, str]]:
    declared = {(c.stack, c.baseline): c.primary for c in spec.analysis.contrasts or ()}
    return [pair for pair in default_pairs(spec) if declared.get(pair, True)]


def planned_contrasts(spec: SweepSpec) -> list[dict[str, Any]] | None:
    """The primary contrasts the spec's report will test (keys as report.json's contrasts),
    or None when its axes are ranges (random or Optuna search: drawn, not listed)."""
    try:
        alphas, betas, free = spec.alpha_values(), spec.beta_values(), spec.free_bits_values()
    except ValueError:
        return None
    metric = spec.analysis.metric
    out = []
    grid = [(a, m, b, f) for a in alphas for m in spec.models for b in betas for f in free]
    if spec.analysis.primary in ("caveat", "caveat_across"):
        kinds = (("all",) if spec.analysis.primary == "caveat_across"
                 else ("prefix", "private", "prefix-private"))
        treated, control = spec.analysis.caveat_treated, spec.analysis.caveat_control
        return [{"contrast": "interaction" if kind == "prefix-private" else "caveat",
                 "loss_stack": treated, "baseline": control, "alpha": a, "model": m, "beta": b,
                 "free_bits": f, "kind": kind, "metric": metric}
                for a, m, b, f in grid if a > 0 for kind in kinds]
    for stack, baseline in _primary_pairs(spec):
        for alpha, model, beta, free_bits in grid:
            point = {"alpha": alpha, "model": model, "seed": 0, "beta": beta,
                     "free_bits": free_bits}
            if objective_key(spec, {**point, "loss_stack": stack}) == objective_key(
                    spec, {**point, "loss_stack": baseline}):
                continue  # one shared trial: not a test (the report's identical_objective)
            out.append({"contrast": "stack", "loss_stack": stack, "baseline": baseline,
                        "alpha": alpha, "model": model, "beta": beta, "free_bits": free_bits,
                        "kind": "all", "metric": metric})
    return out


def _sd(contrast: Mapping[str, Any]) -> float | None:
    diffs = contrast.get("diffs") or []
    return pystats.stdev(diffs) if len(diffs) >= 2 else None


def _pilot_match(planned: Mapping[str, Any], pilot: list[Mapping[str, Any]], spec: SweepSpec
                 ) -> Mapping[str, Any] | None:
    keys = [*_MATCHED, *(axis for axis in ("beta", "free_bits") if getattr(spec, axis) is not None)]
    found = [c for c in pilot if all(c.get(k) == planned.get(k) for k in keys) and _sd(c) is not None]
    found.sort(key=lambda c: c.get("family") != "primary")
    return found[0] if found else None


def pilot_power(spec: SweepSpec, pilot: Mapping[str, Any]) -> dict[str, Any]:
    """The power of the spec's primary family from the pilot's paired SDs (report.json's
    ``power`` shape, with ``pilot``, ``seeds`` and each entry's ``sd_from``).

    Raises:
        PilotMismatch: the pilot compares on another metric, or has no primary contrast with
            two or more paired seeds.
    """
    metric = spec.analysis.metric
    if pilot["analysis"]["metric"] != metric:
        raise PilotMismatch(f"the pilot {pilot['sweep_id']} compares on "
                            f"{pilot['analysis']['metric']}, the spec on {metric} "
                            "(analysis.metric): its paired SDs are in other units")
    contrasts = pilot["contrasts"]
    fallback = [sd for c in contrasts if c.get("family") == "primary"
                and c.get("metric") == metric and (sd := _sd(c)) is not None]
    if not fallback:
        raise PilotMismatch(f"the pilot {pilot['sweep_id']} has no primary contrast on {metric} "
                            "with 2 or more paired seeds: it cannot say how noisy a contrast is")
    planned = planned_contrasts(spec)
    pilot_primary = [c for c in contrasts if c.get("family") == "primary"]
    listed = planned is not None
    family = planned if planned is not None else [dict(c) for c in pilot_primary]
    level = holm_level(len(family))
    n = len(spec.seed_list())
    min_effect = spec.analysis.resolved_min_effect()
    entries = []
    for contrast in family:
        match = _pilot_match(contrast, contrasts, spec)
        sd = _sd(match) if match is not None else max(fallback)
        entry = power_figures(sd, n, level, min_effect)
        entries.append({**{k: contrast.get(k) for k in ("contrast", *_MATCHED, "beta", "free_bits")},
                        **entry, "sd_from": "pilot" if match is not None
                        else "the pilot's largest primary SD (the pilot did not run it)"})
    needed = [e["seeds_needed"] for e in entries]
    return {"pilot": pilot["sweep_id"], "seeds": n, "family_size": len(family),
            "family_listed": listed, "power": POWER, "significance": SIGNIFICANCE,
            "level": level, "level_why": LEVEL_WORDS.format(significance=SIGNIFICANCE,
                                                            m=len(family), level=level),
            "min_effect": min_effect, "entries": entries,
            "seeds_needed": None if not needed or None in needed else max(needed)}


def pilot_lines(power: Mapping[str, Any]) -> list[str]:
    """The pilot's answer in words (``ksweep validate --pilot``)."""
    effect = power["min_effect"]
    lines = [f"Power from pilot {power['pilot']}'s paired SDs, at the spec's {power['seeds']} "
             f"seeds: two-sided paired t test at {power['level_why']}; "
             f"{power['power']:.0%} power."]
    if not power["entries"]:
        return [*lines, "The spec plans no primary contrast (no declared primary pair, and no "
                "uniform to compare every stack against): nothing to power."]
    if not power["family_listed"]:
        lines.append("The spec's alphas are drawn (random or Optuna search): the family is taken "
                     "as the pilot's primary contrasts.")
    for e in power["entries"]:
        name = (f"{e['loss_stack']} - {e['baseline']}" + ("" if e["kind"] == "all" else f" ({e['kind']})")
                + f", alpha {e['alpha']:g}, {e['model']}")
        if e["note"]:
            lines.append(f"{name}: {e['note']}")
            continue
        words = f"{name}: SD {e['paired_sd']:.3f} ({e['sd_from']}); detects {e['detectable']:.3f}"
        if effect is not None:
            needed = "more seeds than planned for" if e["seeds_needed"] is None else f"{e['seeds_needed']} seeds"
            words += f"; {effect:g} needs {needed}"
        lines.append(words)
    if effect is None:
        lines.append("No analysis.min_effect declared: declare one for the seeds it needs.")
    elif power["seeds_needed"] is not None and power["seeds_needed"] > power["seeds"]:
        lines.append(f"To detect {effect:g} in every primary contrast: seeds: "
                     f"{power['seeds_needed']} (the spec has {power['seeds']}).")
    elif power["seeds_needed"] is not None:
        lines.append(f"The spec's {power['seeds']} seeds detect {effect:g} in every primary contrast.")
    return lines

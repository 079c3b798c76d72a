"""The caveat interaction across two sweeps: (R~ - R_tok) on one dataset (or label set) minus
(R~ - R_tok) on the other, paired by seed (``ksweep report ID1 ID2`` when both declare
``analysis.primary: caveat_across``).

The caveat predicts opposite signs of R~ - R_tok where the label's evidence sits in
concentrated examples and where it sits in diffuse ones, so its test is the difference of the
two sides, not either side alone. Each sweep's own report gives R~ - R_tok per seed (matched
exactly: both stacks are undivided, same beta); the interaction pairs those per-seed
differences by seed across the sweeps, so seed ``s`` of one side meets seed ``s`` of the other
(the same initialisation stream and batch order, on another dataset). The interactions on
``analysis.metric`` (one per alpha > 0, model, beta and free bits) are the primary family,
Holm-adjusted; those on the rate ``kl`` are exploratory. Its prediction is derived from the
sides' declared ones: "lower" on the first and "higher" on the second predict "lower".

The two sweeps must agree on everything but their data (``template.data``) and their declared
contrasts (each side predicts its own sign); anything else is refused as :mod:`.compare` refuses
it. Pure: from the two reports alone, so the committed tables of a study recompute it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.report.contrasts import CAVEAT_EXTRA_METRICS, claim_words
from sweeps.report.power import power_section
from sweeps.report.readout_table import ALL_KINDS
from sweeps.report.statistics import holm, metric_range, paired_difference

__all__ = ["ACROSS", "ACROSS_DIFFERENCES", "across_contrasts", "across_report"]

ACROSS = "interaction_across"
ACROSS_DIFFERENCES = ("template.data", "analysis.contrasts")
"""Fields two sweeps may differ in and still be compared across (prefixes of the field path)."""
_KEY = ("alpha", "model", "beta", "free_bits", "metric")


def _sides(report: Mapping[str, Any]) -> dict[tuple, Mapping[str, Any]]:
    analysis = report["analysis"]
    return {tuple(c[k] for k in _KEY): c for c in report["contrasts"]
            if c["contrast"] == "caveat" and c["kind"] == ALL_KINDS
            and c["loss_stack"] == analysis["caveat_treated"]
            and c["baseline"] == analysis["caveat_control"]}


def _side_prediction(report: Mapping[str, Any]) -> str | None:
    analysis = report["analysis"]
    pair = (analysis["caveat_treated"], analysis["caveat_control"])
    return next((c.get("predicted") for c in analysis.get("contrasts") or ()
                 if (c["stack"], c["baseline"]) == pair), None)


def _predicted(first: Mapping[str, Any], second: Mapping[str, Any]) -> str | None:
    signs = (_side_prediction(first), _side_prediction(second))
    return {("lower", "higher"): "lower", ("higher", "lower"): "higher"}.get(signs)  # type: ignore[arg-type]


def across_contrasts(first: Mapping[str, Any], second: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The interactions (first's R~ - R_tok minus second's), families and Holm applied."""
    metric = first["analysis"]["metric"]
    theirs = _sides(second)
    predicted = _predicted(first, second)
    out = []
    for key, mine in _sides(first).items():
        other = theirs.get(key)
        if other is None or key[-1] not in (metric, *CAVEAT_EXTRA_METRICS):
            continue
        diff = paired_difference(dict(zip(mine["seeds"], mine["diffs"], strict=True)),
                                 dict(zip(other["seeds"], other["diffs"], strict=True)),
                                 metric_range(key[-1]))
        out.append({
            "contrast": ACROSS, "kind": f"{first['name']} - {second['name']}",
            **dict(zip(_KEY, key, strict=True)), "split": first["split"],
            "loss_stack": mine["loss_stack"], "baseline": mine["baseline"],
            "sweeps": [first["sweep_id"], second["sweep_id"]],
            "mean_diff": diff.mean_diff, "ci_low": diff.ci_low, "ci_high": diff.ci_high,
            "p_value": diff.p_value, "p_adjusted": None, "n_pairs": diff.n_pairs,
            "n_nan": diff.n_nan, "seeds": diff.seeds, "diffs": diff.diffs,
            "beta_matching": "exact (same beta; both stacks undivided)", "n_unmatched": 0,
            "identical_objective": False,
            "predicted": predicted if key[-1] == metric else None,
            "family": "primary" if key[-1] == metric else "exploratory"})
    family = [e for e in out if e["family"] == "primary"]
    for entry, adjusted in zip(family, holm([e["p_value"] for e in family]), strict=True):
        entry["p_adjusted"] = adjusted
    for entry in out:
        entry["claim"] = claim_words(entry)
    return out


def _side_contrast(report: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    return {**entry, "family": "exploratory", "sweep_id": report["sweep_id"],
            "kind": f"{ALL_KINDS} ({report['name']})", "p_adjusted": None,
            "claim": f"one side of the interaction ({report['name']}): exploratory here"}


def across_report(reports: Sequence[Mapping[str, Any]], seeds: Mapping[str, Sequence[int]],
                  extendable: bool = True) -> dict[str, Any]:
    """The report of two sweeps compared across: report.json's shape, with no cells (each
    sweep's own report holds them); the interactions, each side's R~ - R_tok beside them, the
    power of the interactions and the commands that add seeds to both sweeps.

    Args:
        reports: the two sweeps' reports, in the order of the difference.
        seeds: sweep id -> the seeds it has run.
    """
    first, second = reports
    contrasts = across_contrasts(first, second)
    contrasts += [_side_contrast(r, c) for r in reports for c in _sides(r).values()]
    names = f"{first['name']} - {second['name']}"
    words = [f"The caveat interaction across two sweeps: (R~ - R_tok) in {first['name']} minus "
             f"in {second['name']}, paired by seed over the seeds both ran. Each sweep's cells, "
             "best and collapse are in its own report."]
    words += [f"{r['name']}: {text}" for r in reports for text in r.get("limitations", ())]
    out = {key: first[key] for key in ("objective", "analysis", "split", "readout_source")}
    out.update({
        "sweep_id": f"{first['sweep_id']}+{second['sweep_id']}", "name": names,
        "dedup": {key: sum(r["dedup"].get(key, 0) for r in reports)
                  for key in first["dedup"]},
        "cells": [], "contrasts": contrasts, "best": [], "collapse": [],
        "counts": _summed([r["counts"] for r in reports]),
        "excluded": _summed([r["excluded"] for r in reports]),
        "limitations": words, "extensions": [], "reused": [],
        "power": power_section(contrasts, _min_effect(first), seeds, extendable),
        "compared": [{"sweep_id": r["sweep_id"], "name": r["name"],
                      "seeds": list(seeds.get(r["sweep_id"], ())),
                      "trials": len(r.get("trials", ()))} for r in reports],
        "trials": [{**t, "sweep_id": r["sweep_id"]} for r in reports for t in r.get("trials", ())],
    })
    return out


def _min_effect(report: Mapping[str, Any]) -> float | None:
    """The declared effect of the report's analysis, else the AMI default (as the spec resolves)."""
    from sweeps.spec.sections import AnalysisSpec

    return AnalysisSpec.model_validate(report["analysis"]).resolved_min_effect()


def _summed(counts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for mapping in counts:
        for key, value in mapping.items():
            out[key] = out.get(key, 0) + value
    return out

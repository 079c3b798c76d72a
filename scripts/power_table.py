#!/usr/bin/env python
"""The power of committed sweeps' primary contrasts, as a Markdown table, from their report.json
alone (no service, no MLflow): what ``ksweep report`` prints under "Power by design".

    python scripts/power_table.py docs/science/real_text_wordnet/nouns/report.json \\
        docs/science/real_text_wordnet/adjadv/report.json > docs/science/real_text_wordnet/power.md

Per sweep, each primary contrast's paired SD over seeds, the smallest effect its seeds detect
at 80% power (two-sided paired t test, noncentral t) at the strictest Holm level of its family
and, for comparison, at 0.05 unadjusted, its power now for the effect (``--min-effect``, default
the spec's ``analysis.min_effect``, else 0.03 on AMI), and the seeds that effect needs. With two
reports, the caveat interaction across them ((R~ - R_tok) on the first minus on the second,
paired by seed) declared primary too (its own family of one per alpha). Then the ``ksweep
extend`` commands that get every primary contrast there.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweeps.report.across import across_report
from sweeps.report.contrasts import SIGNIFICANCE
from sweeps.report.power import detectable_effect, power_section


def _seeds(report: Mapping[str, Any]) -> list[int]:
    return sorted({int(trial["seed"]) for trial in report["trials"]})


def _name(entry: Mapping[str, Any]) -> str:
    # An interaction across sweeps is named by its family (the sweeps); a kind by its own name.
    kind = "" if entry["kind"] == "all" or entry["contrast"] == "interaction_across" \
        else f" [{entry['kind']}]"
    return f"{entry['loss_stack']} - {entry['baseline']}{kind}"


def _rows(label: str, section: Mapping[str, Any]) -> list[str]:
    out = []
    for e in section["entries"]:
        if e["paired_sd"] is None:
            out.append(f"| {label} | {_name(e)} | {e['alpha']:g} | {e['n_pairs']} | - | - | - | - | "
                       f"{e['note']} |")
            continue
        unadjusted = detectable_effect(e["paired_sd"], e["n_pairs"], SIGNIFICANCE)
        needed = "-" if e["seeds_needed"] is None else str(e["seeds_needed"])
        out.append(f"| {label} | {_name(e)} | {e['alpha']:g} | {e['n_pairs']} | "
                   f"{e['paired_sd']:.3f} | {e['detectable']:.3f} (at {e['level']:.4g}) | "
                   f"{unadjusted:.3f} | {e['power_at_min_effect']:.2f} | {needed} |")
    return out


def power_markdown(reports: Sequence[Mapping[str, Any]], min_effect: float | None,
                   command: str) -> str:
    """The Markdown page: one table over the sweeps' primary families (and the interaction)."""
    sections = [(r["name"], power_section(r["contrasts"], min_effect, {r["sweep_id"]: _seeds(r)}))
                for r in reports]
    if len(reports) == 2:
        across = across_report(list(reports), {r["sweep_id"]: _seeds(r) for r in reports})
        sections.append((f"interaction {across['name']}",
                         power_section(across["contrasts"], min_effect, {
                             r["sweep_id"]: _seeds(r) for r in reports})))
    effect = sections[0][1]["min_effect"]
    lines = ["# Power of the primary contrasts", "",
             "Generated from the committed report.json files by", "", "```bash", command, "```", "",
             f"Two-sided paired t test over seeds, 80% power, computed from the noncentral t "
             f"distribution; effect to detect: {effect:g} on test "
             f"{reports[0]['analysis']['metric']}. Each family is tested at its strictest Holm "
             "level (0.05 / m for m primary contrasts): a contrast whose p-value is below it is "
             "rejected whatever the others' p-values are, so this is the power each contrast has "
             "on its own. The unadjusted column (0.05) is for comparison only. The paired SD is "
             "itself estimated from the seeds run, so the seeds needed are a planning figure.", "",
             "| family | contrast | alpha | pairs | paired SD | detects at 80% (Holm level) | "
             "detects at 80% (0.05) | power now for the effect | seeds for the effect |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, section in sections:
        lines += _rows(label, section)
    lines += ["", "Seeds that give every primary contrast of a family 80% power for the effect "
              "(the family and its predictions stay as first declared; the grown contrasts are "
              "marked 'extended'):", ""]
    for label, section in sections:
        commands = section["extend"] or ["(none needed)"]
        lines += [f"- {label}: {section['seeds_needed']} seeds; " + "; ".join(
            f"`{c}`" for c in commands)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="report.json files (two: the "
                        "interaction across them too)")
    parser.add_argument("--min-effect", type=float, default=None,
                        help="The effect to detect (default: the first report's "
                        "analysis.min_effect, else 0.03 on AMI).")
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.reports]
    effect = args.min_effect
    if effect is None:
        from sweeps.spec.sections import AnalysisSpec

        effect = AnalysisSpec.model_validate(reports[0]["analysis"]).resolved_min_effect()
    if effect is None or not effect > 0:
        print("give --min-effect: the reports declare no analysis.min_effect and do not compare "
              "on AMI", file=sys.stderr)
        return 2
    command = "python scripts/power_table.py " + " ".join(
        shlex.quote(str(path)) for path in args.reports) + (
        f" --min-effect {args.min_effect:g}" if args.min_effect is not None else "")
    sys.stdout.write(power_markdown(reports, effect, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())

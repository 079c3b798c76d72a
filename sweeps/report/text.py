"""report.md from report.json: the headline, the per-alpha table, the latent-use table, the
rate sections (:mod:`sweeps.report.rate_text`), contrasts, best, collapse, and the words on
what the report cannot claim. Nothing here computes a statistic."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweeps.report.rate_text import credit_notes, rate_markdown
from sweeps.report.verdicts import latent_words
from workers.contract import (
    ACTIVE_UNITS,
    KL,
    LATENT_AMI,
    LATENT_NMI_SHUFFLED,
    MUTUAL_INFO,
    USED_CATEGORIES,
)

__all__ = ["ALL", "LATENT_COLUMNS", "alpha_rows", "beta_text", "headline", "interval_text",
           "latent_note", "latent_rows", "latent_title", "power_lines", "prediction_lines",
           "report_markdown"]

ALL = "all"
# The latent-use table's read-out columns, in order (sweeps.report.latent_use.USE_READOUTS).
_USE_COLUMNS = (KL, MUTUAL_INFO, ACTIVE_UNITS, USED_CATEGORIES, LATENT_AMI, "latent_nmi",
                LATENT_NMI_SHUFFLED)


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def interval_text(entry: Mapping[str, Any], key: str = "mean") -> str:
    """``mean [low, high]`` of an entry (``key`` its point value), or why it has no interval."""
    if entry.get(key) is None:
        return "-"
    if entry.get("ci_low") is None:
        return f"{entry[key]:.3f} (n={entry.get('n', entry.get('n_pairs', 1))}, no interval)"
    return f"{entry[key]:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def beta_text(entry: Mapping[str, Any]) -> str:
    """The raw beta, with its effective beta, its beta in ELBO units and the target rate the
    trial trained to (rate control: the weight then moves) beside it when known."""
    beta = "-" if entry.get("beta") is None else f"{entry['beta']:g}"
    beside = [f"{name} {entry[key]:.3g}" for key, name in (("beta_effective", "eff"),
                                                           ("beta_elbo", "ELBO units"),
                                                           ("target_rate", "target rate"))
              if entry.get(key) is not None]
    return f"{beta} ({', '.join(beside)})" if beside else beta


def headline(report: Mapping[str, Any]) -> str:
    """One line: the primary family's verdict (what the data supports, nothing more)."""
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    metric, split = report["analysis"]["metric"], report["split"]
    if not primary:
        return f"No primary contrast could be computed on {split} {metric}."
    claims = [c for c in primary if c["claim"].startswith(("higher", "lower"))]
    gated = [c for c in primary if c.get("latent_gated")]
    unused = (f" In {len(gated)} of {len(primary)} both sides are collapsed or at chance."
              if gated else "")
    if all(c["n_pairs"] < 3 for c in primary):
        return "No claim: fewer than 3 paired seeds in every primary contrast."
    if len(gated) == len(primary):
        return (f"No claim: in every primary contrast ({len(primary)} on {split} {metric}) both "
                "sides' latents are collapsed or at chance.")
    if not claims:
        return (f"No significant difference in the primary family ({len(primary)} contrasts on "
                f"{split} {metric}, Holm-adjusted).{unused}")
    parts = [f"{c['loss_stack']} {c['claim'].split(' (')[0]} at alpha {c['alpha']:g}"
             f" ({c['kind']}, {c['model']}, beta {beta_text(c)}): {interval_text(c, 'mean_diff')}"
             + (" [flagged: constant-latent baseline]" if c.get("baseline_constant") else "")
             for c in claims]
    return f"{len(claims)} of {len(primary)} primary contrasts differ: " + "; ".join(parts) + unused


def alpha_rows(report: Mapping[str, Any], metric: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The per-alpha table's kinds (``all`` first) and rows, in display order.

    A row holds ``cell`` (its first cell: model, beta, stack, alpha) and each kind's cell under
    the kind's name; the Markdown report and ``ksweep report``'s terminal view both draw it.
    """
    split = report["split"]
    cells = [c for c in report["cells"] if c["split"] == split and c["metric"] == metric]
    kinds = sorted({c["kind"] for c in cells}, key=lambda k: (k != ALL, k))
    rows: dict[tuple, dict[str, Any]] = {}
    for cell in cells:
        key = (cell["model"], cell["beta"] if cell["beta"] is not None else -1,
               cell["free_bits"] or 0, cell.get("target_rate") or 0, cell["loss_stack"],
               cell["alpha"])
        rows.setdefault(key, {"cell": cell})[cell["kind"]] = cell
    return kinds, [rows[key] for key in sorted(rows)]


def _alpha_table(report: Mapping[str, Any], metric: str) -> list[str]:
    split = report["split"]
    kinds, rows = alpha_rows(report, metric)
    if not rows:  # a report across sweeps (sweeps.report.across): each sweep's own has its cells
        return []
    lines = [f"## {split} {metric} by alpha (mean [95% t interval], per-seed values)", ""]
    header = ["model", "beta", "loss_stack", "alpha", *kinds, "seeds"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for entry in rows:
        cell = entry["cell"]
        shown = [interval_text(entry[k]) if k in entry else "-" for k in kinds]
        values = ", ".join(_num(v, 2) for v in entry.get(ALL, cell)["values"])
        shared = " (shared trial)" if cell["shared_with"] else ""
        lines.append("| " + " | ".join([cell["model"], beta_text(cell), cell["loss_stack"] + shared,
                                        f"{cell['alpha']:g}", *shown, values]) + " |")
    return lines


LATENT_COLUMNS = ("model", "beta", "loss_stack", "alpha", "KL", "I(x; z)", "active units",
                  "used categories", "AMI", "NMI", "NMI shuffled", "latent")


def latent_rows(report: Mapping[str, Any],
                verdict: Callable[[Mapping[str, Any]], str] = latent_words) -> list[list[str]]:
    """The latent-use table's rows as text (columns :data:`LATENT_COLUMNS`), in display order:
    the Markdown report and ``ksweep report``'s terminal view both draw it (the terminal with
    ``verdict`` :func:`sweeps.report.verdicts.latent_code`, report.md in words)."""
    cells = (report.get("latent_use") or {}).get("cells") or []
    out = []
    for row in sorted(cells, key=lambda r: (r["model"], r["beta"] if r["beta"] is not None else -1,
                                            r["free_bits"] or 0, r.get("target_rate") or 0,
                                            r["loss_stack"], r["alpha"])):
        shown = [interval_text(row[name]) if name in row else "-" for name in _USE_COLUMNS]
        out.append([row["model"], beta_text(row), row["loss_stack"], f"{row['alpha']:g}", *shown,
                    verdict(row)])
    return out


def latent_title(report: Mapping[str, Any]) -> str:
    use = report["latent_use"]
    return f"Latent use ({use['split']}; in use: mean I(x; z) >= {use['in_use_nats']:g} nats)"


def latent_note(report: Mapping[str, Any]) -> str:
    """How the table's I(x; z) and active units are computed (the estimators named)."""
    use = report["latent_use"]
    return ("I(x; z) estimators: " + "; ".join(f"{family}, {how}" for family, how in use["estimators"].items())
            + ". Active units: Burda et al. (2016), posterior-mean variance over x above 0.01 "
            "(discrete: on the one-hot coordinates, so a collapsed latent reads 0); used "
            "categories: aggregate mass >= 0.01 (a collapsed, spread posterior uses them all).")


def _latent_table(report: Mapping[str, Any]) -> list[str]:
    rows = latent_rows(report)
    if not rows:
        return []
    lines = [f"## {latent_title(report)}", "", "| " + " | ".join(LATENT_COLUMNS) + " |",
             "|" + "---|" * len(LATENT_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + ["", latent_note(report), "", *(f"**{words}**" for words in credit_notes(report)),
                    *([""] if credit_notes(report) else [])]


def _contrast_table(contrasts: Sequence[Mapping[str, Any]], title: str) -> list[str]:
    if not contrasts:
        return []
    lines = [f"## {title}", "",
             "| family | contrast | model | alpha | beta | kind | metric | mean diff [95%] | "
             "p (Holm) | pairs | matching | what it supports |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in contrasts:
        name = f"{c['loss_stack']} - {c['baseline']}"
        p = c["p_adjusted"] if c["family"] == "primary" else c["p_value"]
        p_text = "-" if p is None else f"{p:.3g}" + ("" if c["family"] == "primary" else " (raw)")
        lines.append(
            f"| {c['family']} | {name} | {c['model']} | {c['alpha']:g} | {beta_text(c)} | {c['kind']} "
            f"| {c['metric']} | {interval_text(c, 'mean_diff')} | {p_text} | {c['n_pairs']} | "
            f"{c['beta_matching']} | {c['claim']} |")
    return lines + [""]


def selection_lines(report: Mapping[str, Any]) -> list[str]:
    """How the checkpoints were chosen, and per cell how many seeds chose their last epoch
    (report.json's ``selection`` and cells' ``last_epoch``; report.md and ``ksweep report``'s
    terminal view both print these lines)."""
    selection = report.get("selection")
    if not selection:
        return []
    counts = [c for c in report["cells"] if c.get("last_epoch") and c["kind"] == ALL
              and c["metric"] == report["analysis"]["metric"] and c["split"] == report["split"]]
    words = "; ".join(f"{c['loss_stack']} alpha {c['alpha']:g} {c['model']}"
                      + (f" beta {c['beta']:g}" if c.get("beta") is not None else "")
                      + f" {c['last_epoch']}/{c['n'] + c['n_nan']}" for c in counts)
    return [f"Checkpoint: {selection['words']}",
            f"Chose their last epoch, per cell: {words or 'none'}."]


def _contrast_name(entry: Mapping[str, Any]) -> str:
    kind = "" if entry.get("kind") in (None, ALL) else f" ({entry['kind']})"
    beta = "" if entry.get("beta") is None else f", beta {entry['beta']:g}"
    return (f"{entry['loss_stack']} - {entry['baseline']}{kind}, alpha {entry['alpha']:g}{beta}, "
            f"{entry['model']}")


def power_lines(report: Mapping[str, Any]) -> list[str]:
    """The power of each primary contrast in words, and what gets the family to its declared
    effect (report.json's ``power``; :mod:`sweeps.report.power`). The Markdown report and
    ``ksweep report``'s terminal view both print these lines."""
    power = report.get("power") or {}
    if not power.get("entries"):
        return []
    metric = report["analysis"]["metric"]
    effect = power["min_effect"]
    lines = [f"Two-sided paired t test over seeds at {power['level_why']}; {power['power']:.0%} "
             "power; " + (f"effect to detect {effect:g} {metric} (analysis.min_effect)."
                          if effect is not None else "no analysis.min_effect declared.")]
    for e in power["entries"]:
        if e["paired_sd"] is None:
            lines.append(f"{_contrast_name(e)}: {e['note']}")
            continue
        words = (f"{_contrast_name(e)}: {e['n_pairs']} pairs, paired SD {e['paired_sd']:.3f}; "
                 f"detects {e['detectable']:.3f} at {power['power']:.0%} power")
        if effect is not None:
            needed = ("more seeds than the report plans for" if e["seeds_needed"] is None
                      else f"{e['seeds_needed']} seeds")
            words += (f"; {effect:g} has power {e['power_at_min_effect']:.2f} now and needs "
                      f"{needed}")
        lines.append(words)
    lines += [f"More seeds: {command}" for command in power["extend"]]
    if power.get("advice"):
        lines.append(power["advice"][0].upper() + power["advice"][1:] + ".")
    return lines


def prediction_lines(report: Mapping[str, Any]) -> list[str]:
    """The predictions in words, with the submission time (report.md, the terminal view)."""
    section = report.get("predictions") or {}
    entries = [c for c in section.get("contrasts", ()) if c["predicted"] or c["predicted_now"]]
    if not entries:
        return []
    when = section.get("submitted_at") or "time not recorded"
    lines = [f"Declared at submission ({when}), before any trial ran; each contrast is judged on "
             "its prediction as first declared."]
    for c in entries:
        words = (f"{c['stack']} - {c['baseline']}: {c['predicted'] or 'none'} "
                 f"({'primary' if c['primary'] else 'exploratory'})")
        if c["changed"]:
            words += (f"; CHANGED after the first segment ran: the spec now says "
                      f"{c['predicted_now'] or 'none'}")
        elif c["declared_later"]:
            words += "; declared after the first segment ran (not a prediction made before the data)"
        lines.append(words)
    return lines


def report_markdown(report: Mapping[str, Any], metrics: Sequence[str] | None = None) -> str:
    """The report as Markdown (what ``ksweep report`` prints and report.md holds)."""
    metric = report["analysis"]["metric"]
    dedup = report["dedup"]
    lines = [f"# Sweep {report['name']} ({report['sweep_id']})", "",
             f"**{headline(report)}**", "",
             f"Trials: {', '.join(f'{k} {v}' for k, v in sorted(report['counts'].items()))}; "
             f"{dedup['trials_requested']} rows requested, {dedup['trials_run']} trials run "
             f"({dedup['trials_saved_by_dedup']} saved by dedup). Tables: {report['split']} "
             f"split, read at {report['readout_source']}. Selection (best, collapse beta) reads "
             "val only.", ""]
    lines += [line for entry in selection_lines(report) for line in (entry, "")]
    for entry in report.get("compared") or []:
        lines += [f"- compared: {entry['sweep_id']} ({entry['name']}), {entry['trials']} trials, "
                  f"seeds {', '.join(str(s) for s in entry['seeds'])}"]
    if report.get("compared"):
        lines += [""]
    views = report.get("mlflow_views") or {}
    if views:
        lines += [f"MLflow: metric against alpha (summary runs) {views['summary']} ; "
                  f"the trial runs with their axes {views['trials']}"]
        lines += [f"MLflow: the trials reused from other sweeps, by run id {url}"
                  for name, url in sorted(views.items()) if name.startswith("reused")] + [""]
    data = report.get("data") or {}
    if data.get("source") == "dataset":
        lines += [f"Data: dataset {data['dataset']} (sha256 {data['sha256']}), base "
                  f"{data['base']}. R^ = R~/c_base with a learned or precomputed base: R^ < 1 "
                  "does not mean a stack beats the base (see docs/guide/datasets-training.md).", ""]
        lines += [f"- Absent: {item['readouts']}. Why: {item['why']}." for item in data["absent"]]
        lines += [""]
    if report.get("reused"):
        lines += ["## Trials reused from other sweeps (read in their own runs)", "",
                  "| trial | sweep | MLflow run |", "|---|---|---|"]
        lines += [f"| {r['trial_id']} | {r['sweep_id']} | {r['mlflow_run_id']} |"
                  for r in report["reused"]] + [""]
    if report["limitations"]:
        lines += ["## What this report cannot claim", ""]
        lines += [f"- {words}" for words in report["limitations"]] + [""]
    for name in metrics or (metric,):
        lines += _alpha_table(report, name) + [""]
    lines += _latent_table(report)
    lines += rate_markdown(report)
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    lines += _contrast_table(primary, "Primary contrasts (Holm within this family)")
    predicted = prediction_lines(report)
    if predicted:
        lines += ["## Predictions", ""] + [f"- {words}" for words in predicted] + [""]
    power = power_lines(report)
    if power:
        lines += ["## Power by design (the primary family)", ""]
        lines += [f"- {words}" for words in power] + [""]
    caveat = [c for c in report["contrasts"] if c["family"] != "primary"
              and c["contrast"] in ("caveat", "interaction")]
    lines += _contrast_table(caveat, "Caveat contrasts (exploratory)")
    others = [c for c in report["contrasts"] if c["family"] != "primary"
              and c["contrast"] == "stack" and c["metric"] == metric and c["kind"] == ALL]
    lines += _contrast_table(others, "Other stack contrasts on the primary metric (exploratory)")
    lines += ["## Best configuration per model and beta (chosen on val, test beside it)", ""]
    for best in report["best"]:
        chosen = best["selected"]
        lines.append(f"- {best['model']}, beta {beta_text(best)}: {chosen['loss_stack']} at alpha "
                     f"{chosen['alpha']:g} (val {_num(best['val']['mean'])}); "
                     f"{best['split']} {interval_text(best['test'] or {})}"
                     + (f"; tied on val with {', '.join(best['ties_on_val'])}"
                        if best["ties_on_val"] else ""))
    if report["collapse"]:
        lines += ["", "## Collapse beta (largest beta with mean val NMI >= threshold)", ""]
        for entry in report["collapse"]:
            beta = "-" if entry["collapse_beta"] is None else beta_text({
                "beta": entry["collapse_beta"], "beta_effective": entry["collapse_beta_effective"],
                "beta_elbo": entry.get("collapse_beta_elbo")})
            lines.append(f"- {entry['loss_stack']} alpha {entry['alpha']:g} {entry['model']}: "
                         f"{beta}, {entry['status']}; {entry['split']} NMI there "
                         f"{interval_text(entry['test'] or {})}")
    return "\n".join(lines) + "\n"

"""``ksweep report``'s terminal view: the report as tables that fit the terminal.

Readable at 80 columns (``make demo``'s terminal): each table row is at most two lines. Stack
labels are shortened with a legend when the full ones do not fit; the latent-use verdict and
what a contrast supports become short codes (``used 5/5``, ``n.s.*``) with a legend line under
their table when their words do not fit (:mod:`sweeps.report.verdicts`); a column never cuts
a word (intervals and per-seed values stay on one line), and a column that does not fit leaves
its table whole (:mod:`ksweep.cli.fitted_table`); the ties on val are listed under the best
table rather than wrapped in it. Markdown stays the MLflow
artifact (report.md) and ``--format md`` prints it raw.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from ksweep.cli.fitted_table import Column, fit_layouts, fit_table, short_labels
from ksweep.cli.rate_view import rate_tables
from sweeps.report.growth import describe_extensions
from sweeps.report.rate_text import credit_notes
from sweeps.report.text import (
    ALL,
    LATENT_COLUMNS,
    alpha_rows,
    beta_text,
    headline,
    interval_text,
    latent_note,
    latent_rows,
    latent_title,
    power_lines,
    prediction_lines,
    selection_lines,
)
from sweeps.report.verdicts import (
    claim_code,
    claim_legend,
    latent_code,
    latent_legend,
    latent_words,
)

__all__ = ["render_report", "report_renderables"]

Label = Callable[[str], str]


def _lines(words: Sequence[str], bullet: str = "-") -> Table:
    """Paragraphs with a hanging indent (wrapped at words)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for text in words:
        grid.add_row(bullet, Text(text))  # plain text: "[log q ...]" is no markup
    return grid


def _alpha_columns(report: Mapping[str, Any], metric: str, label: Label) -> list[Column]:
    kinds, rows = alpha_rows(report, metric)
    columns = [Column("model", rank=3), Column("beta", whole=True, rank=3),
               Column("loss stack", keep=True), Column("alpha", keep=True, justify="right")]
    # At a narrow width the per-seed values go first (one line or none: --format md has them),
    # then the per-kind columns.
    columns += [Column(kind, keep=kind == ALL, whole=True, rank=1) for kind in kinds]
    columns.append(Column("per seed", whole=True, rank=-1))
    for entry in rows:
        cell = entry["cell"]
        values = ", ".join("-" if v is None else f"{v:.2f}" for v in entry.get(ALL, cell)["values"])
        shown = [cell["model"], beta_text(cell),
                 label(cell["loss_stack"]) + ("*" if cell["shared_with"] else ""),
                 f"{cell['alpha']:g}", *(interval_text(entry[k]) if k in entry else "-" for k in kinds),
                 values]
        for column, text in zip(columns, shown, strict=True):
            column.cells.append(text)
    return columns


# At a narrow width the latent-use table keeps the stack, alpha, I(x; z) and the verdict.
_LATENT_KEEP = {"loss_stack", "alpha", "I(x; z)", "latent"}
_LATENT_RANK = {"model": 3, "beta": 3, "AMI": 2, "NMI": 1, "NMI shuffled": 1, "KL": 1,
                "active units": 1, "used categories": 1}


def _latent_columns(report: Mapping[str, Any], label: Label, coded: bool) -> list[Column]:
    """The latent-use table, its verdict in words or (``coded``) as a code read by
    :func:`latent_legend`."""
    columns = [Column(name.replace("_", " "), keep=name in _LATENT_KEEP,
                      whole=name != "loss_stack" and (coded or name != "latent"),
                      rank=_LATENT_RANK.get(name, 0),
                      justify="right" if name == "alpha" else "left") for name in LATENT_COLUMNS]
    stack = LATENT_COLUMNS.index("loss_stack")
    for row in latent_rows(report, latent_code if coded else latent_words):
        row = [label(text) if index == stack else text for index, text in enumerate(row)]
        for column, text in zip(columns, row, strict=True):
            column.cells.append(text)
    return columns


def _contrast_columns(contrasts: Sequence[Mapping[str, Any]], label: Label,
                      coded: bool) -> list[Column]:
    """The contrasts table, what each supports in words or (``coded``) as a code read by
    :func:`claim_legend` beside the declared prediction."""
    columns = [Column("contrast", keep=True), Column("model"),
               Column("alpha", keep=True, justify="right"), Column("beta", whole=True),
               Column("kind"), Column("mean diff [95%]", keep=True, whole=True),
               Column("p", keep=True, whole=True), Column("pairs", justify="right"),
               Column("verdict" if coded else "supports", keep=True, whole=coded)]
    if coded:
        columns.append(Column("predicted", whole=True, rank=-1))
    for c in contrasts:
        p = c["p_adjusted"] if c["family"] == "primary" else c["p_value"]
        shown = [f"{label(c['loss_stack'])} - {label(c['baseline'])}", c["model"],
                 f"{c['alpha']:g}", beta_text(c), c["kind"], interval_text(c, "mean_diff"),
                 "-" if p is None else f"{p:.3g}", str(c["n_pairs"]),
                 claim_code(c) if coded else c["claim"]]
        if coded:
            shown.append(c.get("predicted") or "-")
        for column, text in zip(columns, shown, strict=True):
            column.cells.append(text)
    return columns


def _best_columns(best: Sequence[Mapping[str, Any]], label: Label) -> list[Column]:
    columns = [Column("model"), Column("beta", whole=True), Column("loss stack", keep=True),
               Column("alpha", keep=True, justify="right"), Column("val", keep=True, whole=True),
               Column("held out [95%]", keep=True, whole=True)]
    for entry in best:
        val = entry["val"]["mean"]
        test = entry["test"] or {}
        shown = [entry["model"], beta_text(entry), label(entry["selected"]["loss_stack"]),
                 f"{entry['selected']['alpha']:g}", "-" if val is None else f"{val:.3f}",
                 f"{entry['split']} {interval_text(test)}"]
        for column, text in zip(columns, shown, strict=True):
            column.cells.append(text)
    return columns


def _ties(best: Sequence[Mapping[str, Any]], label: Label) -> list[str]:
    words = []
    for entry in best:
        if entry["ties_on_val"]:
            tied = ", ".join(label(t.split("@")[0]) + "@" + t.split("@", 1)[1]
                             for t in entry["ties_on_val"])
            words.append(f"{entry['model']}, beta {beta_text(entry)}: "
                         f"{label(entry['selected']['loss_stack'])} tied on val with {tied}")
    return words


def _tables(report: Mapping[str, Any], width: int, label: Label
            ) -> list[tuple[Table, list[str], list[str]]]:
    """Each table, the words saying what left it, and the words printed under it."""
    metric, split = report["analysis"]["metric"], report["split"]
    tables: list[tuple[Table, list[str], list[str]]] = []
    if report["cells"]:
        alpha_table, alpha_notes = fit_table(f"{split} {metric} by alpha: mean [95% t interval]",
                                             _alpha_columns(report, metric, label), width)
        tables.append((alpha_table, alpha_notes, []))
    if latent_rows(report):
        table, notes, legend = fit_layouts(latent_title(report), [
            (_latent_columns(report, label, coded=False), []),
            (_latent_columns(report, label, coded=True),
             [latent_legend(report["latent_use"]["in_use_nats"])])], width)
        tables.append((table, notes, [*legend, latent_note(report), *credit_notes(report)]))
    tables += rate_tables(report, width, label)
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    if primary:
        tables.append(fit_layouts("Primary contrasts, Holm within the family", [
            (_contrast_columns(primary, label, coded=False), []),
            (_contrast_columns(primary, label, coded=True), [claim_legend()])], width))
    if report["best"]:
        tables.append((*fit_table("Best per model and beta, chosen on val, held-out split "
                                  "beside it", _best_columns(report["best"], label), width), []))
    return tables


def _legend(report: Mapping[str, Any], short: dict[str, str]) -> list[str]:
    pairs = [f"{s} = {label}" for label, s in short.items() if s != label]
    shared = any(c["shared_with"] for c in report["cells"])
    legend = ["stacks: " + ", ".join(pairs)] if pairs else []
    if shared:
        legend.append("* a shared trial: one objective standing in several rows (dedup)")
    return legend


def _header(report: Mapping[str, Any]) -> list[RenderableType]:
    dedup = report["dedup"]
    reused = dedup.get("trials_reused") or 0
    parts: list[RenderableType] = [
        Text(f"Sweep {report['name']} ({report['sweep_id']})", style="bold"),
        Text(headline(report), style="bold"),
        Text(f"Trials: {', '.join(f'{k} {v}' for k, v in sorted(report['counts'].items()))}; "
             f"{dedup['trials_requested']} rows, {dedup['trials_run']} trials "
             f"({dedup['trials_saved_by_dedup']} saved by dedup"
             + (f", {reused} reused from other sweeps" if reused else "")
             + f"); {report['split']} split, read at {report['readout_source']}.")]
    compared = report.get("compared") or []
    if compared:
        parts.append(_lines([f"{c['sweep_id']} ({c['name']}): {c['trials']} trials, seeds "
                             f"{', '.join(str(s) for s in c['seeds'])}" for c in compared]))
    if report.get("extensions"):
        parts.append(_lines(describe_extensions(report["extensions"])))
    if report.get("reused"):
        parts.append(_lines([f"reused {r['trial_id']} from sweep {r['sweep_id']} (run "
                             f"{r['mlflow_run_id']})" for r in report["reused"]]))
    return parts


def report_renderables(report: Mapping[str, Any], width: int) -> list[RenderableType]:
    """Everything :func:`render_report` prints, fitted to ``width`` columns."""
    labels = sorted({c["loss_stack"] for c in (*report["cells"], *report["contrasts"])}
                    | {c.get("baseline") or c["loss_stack"] for c in report["contrasts"]})
    full: dict[str, str] = {label: label for label in labels}
    short = full
    tables = _tables(report, width, full.__getitem__)
    if any(notes for _, notes, _ in tables):  # the full labels do not fit: short ones, a legend
        short = short_labels(labels)
        tables = _tables(report, width, lambda label: short.get(label, label))
    out: list[RenderableType] = _header(report)
    selection = selection_lines(report)
    if selection:
        out.append(_lines(selection))
    legend = _legend(report, short)
    if legend:
        out.append(_lines(legend, bullet=" "))
    for table, notes, under in tables:
        out.append(table)
        if notes or under:
            out.append(_lines([*notes, *under], bullet=" "))
    predicted = prediction_lines(report)
    if predicted:
        out += [Text("Predictions", style="bold"), _lines(predicted)]
    power = power_lines(report)
    if power:
        out += [Text("Power by design (the primary family)", style="bold"), _lines(power)]
    ties = _ties(report["best"], lambda label: short.get(label, label))
    if ties:
        out.append(_lines(ties))
    if report["limitations"]:
        out.append(Text("What this report cannot claim", style="bold"))
        out.append(_lines(report["limitations"]))
    return out


def render_report(report: Mapping[str, Any], console: Console) -> None:
    """Print the headline, the per-alpha table of the analysis metric, the primary contrasts,
    the best configurations and what the report cannot claim, within the console's width."""
    for renderable in report_renderables(report, console.width):
        console.print(renderable)

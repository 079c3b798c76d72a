"""``ksweep report``'s terminal view: the report as rich tables sized to the terminal (a long
cell wraps inside its column; a row is never broken across lines as Markdown pipes are).
Markdown stays the MLflow artifact (report.md) and ``--format md`` prints it raw."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

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
)


def _alpha_table(report: Mapping[str, Any], metric: str) -> Table:
    split = report["split"]
    kinds, rows = alpha_rows(report, metric)
    table = Table(title=f"{split} {metric} by alpha: mean [95% t interval]", title_justify="left")
    for column in ("model", "beta", "loss stack", "alpha", *kinds, "per seed"):
        table.add_column(column, overflow="fold")
    for entry in rows:
        cell = entry["cell"]
        values = ", ".join("-" if v is None else f"{v:.2f}" for v in entry.get(ALL, cell)["values"])
        table.add_row(cell["model"], beta_text(cell),
                      cell["loss_stack"] + (" (shared)" if cell["shared_with"] else ""),
                      f"{cell['alpha']:g}", *(interval_text(entry[k]) if k in entry else "-"
                                               for k in kinds), values)
    return table


def _latent_table(report: Mapping[str, Any]) -> Table:
    table = Table(title=latent_title(report), title_justify="left", caption=latent_note(report),
                  caption_justify="left")
    for column in LATENT_COLUMNS:
        table.add_column(column, overflow="fold")
    for row in latent_rows(report):
        table.add_row(*row)
    return table


def _contrast_table(contrasts: Sequence[Mapping[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("contrast", "model", "alpha", "beta", "kind", "mean diff [95%]", "p", "pairs",
                   "supports"):
        table.add_column(column, overflow="fold")
    for c in contrasts:
        p = c["p_adjusted"] if c["family"] == "primary" else c["p_value"]
        table.add_row(f"{c['loss_stack']} - {c['baseline']}", c["model"], f"{c['alpha']:g}",
                      beta_text(c), c["kind"], interval_text(c, "mean_diff"),
                      "-" if p is None else f"{p:.3g}", str(c["n_pairs"]), c["claim"])
    return table


def _best_table(best: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="Best per model and beta (chosen on val, held-out split beside it)",
                  title_justify="left")
    for column in ("model", "beta", "loss stack", "alpha", "val", "held out [95%]", "tied on val"):
        table.add_column(column, overflow="fold")
    for entry in best:
        val = entry["val"]["mean"]
        table.add_row(entry["model"], beta_text(entry), entry["selected"]["loss_stack"],
                      f"{entry['selected']['alpha']:g}", "-" if val is None else f"{val:.3f}",
                      f"{entry['split']} {interval_text(entry['test'] or {})}",
                      ", ".join(entry["ties_on_val"]) or "-")
    return table


def render_report(report: Mapping[str, Any], console: Console) -> None:
    """Print the headline, the per-alpha table of the analysis metric, the latent-use table, the
    primary contrasts, the best configurations and what the report cannot claim."""
    metric = report["analysis"]["metric"]
    dedup = report["dedup"]
    console.print(f"[bold]Sweep {report['name']} ({report['sweep_id']})[/bold]")
    console.print(f"[bold]{headline(report)}[/bold]")
    console.print(f"Trials: {', '.join(f'{k} {v}' for k, v in sorted(report['counts'].items()))}; "
                  f"{dedup['trials_requested']} rows, {dedup['trials_run']} trials run "
                  f"({dedup['trials_saved_by_dedup']} saved by dedup); {report['split']} split, "
                  f"read at {report['readout_source']}.")
    console.print(_alpha_table(report, metric))
    if latent_rows(report):
        console.print(_latent_table(report))
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    if primary:
        console.print(_contrast_table(primary, "Primary contrasts (Holm within the family)"))
    if report["best"]:
        console.print(_best_table(report["best"]))
    if report["limitations"]:
        console.print("[bold]What this report cannot claim[/bold]")
        for words in report["limitations"]:
            console.print(f"  - {words}")

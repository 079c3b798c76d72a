"""The CLI of the service, on :class:`ksweep.Client`: ``ksweep submit | status | watch |
cancel | report | export``. The client returns typed values and raises; these commands print
them and turn errors into messages and exit codes (2 bad input or state, 4 service down).

It talks to ``KSWEEP_URL`` with ``KSWEEP_TOKEN``; with no token set it falls back to the
token a local ``ksweep serve`` generated under ``KSWEEP_SWEEP_ROOT`` (owner ``local``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ksweep import ApiError, Client, KsweepError, SpecError
from ksweep.progress import best_text, counter_line, finished, format_eta
from service.lifecycle import TERMINAL_SWEEP_STATES
from sweeps.status import SweepState

console = Console()
# `ksweep watch` exits with the outcome: scripts can tell success from failure or cancel.
EXIT_CODES = {SweepState.SUCCEEDED: 0, SweepState.FAILED: 1, SweepState.CANCELLED: 3}
BAD_INPUT = (400, 404, 409, 413, 422)


@contextlib.contextmanager
def api_errors_exit() -> Iterator[None]:
    """Print a client error and exit: 2 for bad input, a missing sweep or a wrong state; 4
    when the service is down or failed."""
    try:
        yield
    except SpecError as error:
        console.print(f"[red]{error}[/red]", highlight=False)
        raise typer.Exit(2) from None
    except ApiError as error:
        console.print(f"[red]{error}[/red]", highlight=False)
        raise typer.Exit(2 if error.status in BAD_INPUT else 4) from None
    except KsweepError as error:  # ServiceUnreachable, WaitTimeout
        console.print(f"[red]{error}[/red]", highlight=False)
        raise typer.Exit(4) from None


def request_or_exit(method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One API call for the CLI's other command groups (``ksweep data``): the response, or
    the problem printed and an exit as every command's."""
    with api_errors_exit(), Client() as client:
        return client.request(method, path, **kwargs)


def submit_command(
    spec_path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Sweep spec YAML/JSON."),
    idempotency_key: str = typer.Option(None, help="Resubmitting with the same key is safe."),
) -> None:
    """Submit a sweep; prints its id and URLs."""
    with api_errors_exit(), Client() as client:
        sweep = client.submit(spec_path, idempotency_key=idempotency_key)
    console.print(f"sweep [bold]{sweep.id}[/bold] ({sweep.name}): {sweep.state}, "
                  f"{sweep.counters.total} trials")
    console.print(f"  status: {client.base}/sweeps/{sweep.id}")
    console.print(f"  watch:  ksweep watch {sweep.id}")
    print(sweep.id)


def status_command(sweep_id: str = typer.Argument(None, help="A sweep id; omit to list sweeps.")) -> None:
    """One sweep's state, counters, best so far and ETA; or the list of sweeps."""
    with api_errors_exit(), Client() as client:
        if sweep_id is None:
            page = client.list(limit=50)
            table = Table(title=f"sweeps ({page.total})")
            for column in ("id", "name", "owner", "state", "trials", "best", "created"):
                table.add_column(column)
            for item in page.items:
                table.add_row(item.id, item.name, item.owner, item.state,
                              f"{finished(item)}/{item.counters.total}", best_text(item),
                              item.created_at.isoformat()[:19])
            console.print(table)
            return
        sweep = client.get(sweep_id)
    console.print(f"sweep [bold]{sweep.id}[/bold] ({sweep.name}, owner {sweep.owner}): "
                  f"[bold]{sweep.state}[/bold]")
    console.print(f"  trials: {counter_line(sweep)}")
    console.print(f"  best:   {best_text(sweep)}   ETA {format_eta(sweep.eta_seconds)}")
    if sweep is not None and sweep.mlflow.ui_url:
        console.print(f"  MLflow: {sweep.mlflow.ui_url}")
    if sweep.error:
        console.print(f"  [red]error:[/red] {sweep.error}")


def watch_command(
    sweep_id: str = typer.Argument(..., help="The sweep to follow."),
    interval: float = typer.Option(2.0, help="Seconds between polls."),
) -> None:
    """A live progress bar until the sweep ends; exit 0 succeeded, 1 failed, 3 cancelled."""
    # Sized to fit 80 columns (name, bar, 15/15, state, best metric and value, ETA, elapsed).
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=12),
                        MofNCompleteColumn(), TextColumn("{task.fields[state]}"),
                        TextColumn("{task.fields[best]}"), TextColumn("ETA {task.fields[eta]}"),
                        TimeElapsedColumn(), console=console)
    with api_errors_exit(), Client() as client, progress:
        task = progress.add_task(sweep_id, total=None, state="", best="-", eta="-")
        while True:
            sweep = client.get(sweep_id)
            progress.update(task, description=sweep.name, total=sweep.counters.total or None,
                            completed=finished(sweep), state=sweep.state,
                            best=best_text(sweep, short=True),
                            eta=format_eta(sweep.eta_seconds))
            if sweep.state in TERMINAL_SWEEP_STATES:
                break
            time.sleep(interval)
    # One short line: the counters line wrapped at 80 columns and left "of 15" on a line of its own.
    c = sweep.counters
    console.print(f"sweep {sweep_id} {sweep.state}: {finished(sweep)}/{c.total} trials ended "
                  f"({c.done} done, {c.stopped} stopped, {c.failed} failed)", soft_wrap=True)
    if sweep.error:
        console.print(f"[red]error:[/red] {sweep.error}")
    raise typer.Exit(EXIT_CODES[sweep.state])


def cancel_command(sweep_id: str = typer.Argument(..., help="The sweep to cancel.")) -> None:
    """Cancel a sweep (its driver and trials stop; finished trials stay in MLflow)."""
    with api_errors_exit(), Client() as client:
        sweep = client.cancel(sweep_id)
    console.print(f"sweep {sweep_id}: {sweep.state} ({counter_line(sweep)})")


class ReportFormat(StrEnum):
    table = "table"
    md = "md"
    json = "json"


def report_command(
    sweep_ids: list[str] = typer.Argument(..., metavar="ID", help="An ended sweep; several "
                                          "compatible sweeps give one report over all of them."),
    format: ReportFormat = typer.Option(ReportFormat.table, "--format", "-f",
                                        help="table: rich tables sized to the terminal; md: the "
                                             "Markdown of report.md; json: report.json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json.", hidden=True),
) -> None:
    """The comparison: alpha x loss_stack x model, mean and 95% interval over seeds."""
    with api_errors_exit(), Client() as client:
        # Several sweeps: one report over all of them (GET /sweeps:compare), no MLflow link.
        report = client.compare(sweep_ids) if len(sweep_ids) > 1 else client.report_json(sweep_ids[0])
        sweep = None if len(sweep_ids) > 1 else client.get(sweep_ids[0])
    if as_json or format is ReportFormat.json:
        print(json.dumps(report, indent=2))
        return
    if format is ReportFormat.md:
        from sweeps.report.text import report_markdown

        print(report_markdown(report), end="")
    else:
        from ksweep.cli.report_view import render_report

        render_report(report, console)
    if sweep is not None and sweep.mlflow.ui_url:
        console.print(f"MLflow: {sweep.mlflow.ui_url}", soft_wrap=True)


class ExportFormat(StrEnum):
    csv = "csv"
    parquet = "parquet"
    json = "json"


class ExportTable(StrEnum):
    trials = "trials"
    cells = "cells"
    contrasts = "contrasts"
    history = "history"


def export_command(
    sweep_id: str = typer.Argument(..., help="An ended sweep."),
    format: ExportFormat = typer.Option(ExportFormat.csv, "--format", "-f"),
    table: ExportTable = typer.Option(ExportTable.trials, "--table", "-t"),
    output: Path = typer.Option(None, "--output", "-o", dir_okay=False,
                                help="The file to write; default stdout (csv, json) or "
                                     "ID-TABLE.parquet."),
    metrics: str = typer.Option(None, help="History metrics, comma-separated "
                                           "(default the report's curves: val/latent_nmi, val/latent_ari, "
                                           "val/loss, val/kl, val/kappa_mean)."),
) -> None:
    """Write one table of a sweep (trials, cells, contrasts, history) as CSV, Parquet or JSON
    records."""
    names = [m for m in (metrics or "").split(",") if m] or None
    with api_errors_exit(), Client() as client:
        frame = client.frame(sweep_id, table.value, names)
    if format is ExportFormat.parquet and output is None:
        output = Path(f"{sweep_id}-{table.value}.parquet")
    if output is not None and output.parent != Path() and not output.parent.is_dir():
        console.print(f"[red]--output {output}: no folder {output.parent}[/red]")
        raise typer.Exit(2)
    if format is ExportFormat.parquet:
        frame.to_parquet(output, index=False)
    elif format is ExportFormat.csv:
        frame.to_csv(output if output is not None else sys.stdout, index=False)
    else:
        text = frame.to_json(orient="records", indent=1)
        if output is None:
            print(text)
        else:
            output.write_text(text + "\n")
    if output is not None:
        print(f"{len(frame)} rows of {table.value} -> {output}", file=sys.stderr)

"""``ksweep sweep run SPEC`` (a whole sweep in-process) and ``ksweep validate SPEC`` (dry run)."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from sweeps.progress import SweepStatus
from workers.cli import default_sweep_root, format_validation_error
from workers.tracking import default_tracking_uri

console = Console()
sweep_app = typer.Typer(help="Run sweeps in-process (no service).", no_args_is_help=True)


def load_spec_or_exit(path: Path):
    """Load and validate a spec, printing every problem with its field path (exit 2)."""
    from sweeps.spec import load_sweep_spec

    try:
        return load_sweep_spec(path)
    except ValidationError as error:
        console.print(f"[red]invalid sweep spec {path}:[/red]\n{format_validation_error(error)}")
        raise typer.Exit(2) from None
    except (ValueError, OSError) as error:
        console.print(f"[red]{path}: {error}[/red]")
        raise typer.Exit(2) from None


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class LiveView:
    """A progress sink drawing the trial counters, best-so-far and ETA."""

    def __init__(self, total: int, title: str) -> None:
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("ETA {task.fields[eta]}"))
        self.task = self.progress.add_task(title, total=total, eta="-")
        self.table = Table.grid(padding=(0, 2))
        self.live = Live(self._render(None), console=console, refresh_per_second=4)

    def _render(self, status: SweepStatus | None):
        table = Table(show_header=True, header_style="bold")
        for column in ("pending", "running", "done", "stopped", "failed", "best"):
            table.add_column(column, justify="right")
        if status is not None:
            best = "-" if status.best_value is None else f"{status.best_metric} {status.best_value:.4f}"
            table.add_row(*(str(getattr(status, k)) for k in ("pending", "running", "done",
                                                              "stopped", "failed")), best)
        return Group(self.progress, table)

    def publish(self, status: SweepStatus) -> None:
        self.progress.update(self.task, total=status.total, completed=status.finished,
                             eta=format_eta(status.eta_seconds))
        self.live.update(self._render(status))


@sweep_app.command("run")
def run_command(
    spec_path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Sweep spec YAML/JSON."),
    sweep_id: str = typer.Option(None, help="Resume (or name) this sweep id; default a new one."),
    num_cpus: int = typer.Option(None, help="CPUs for the local Ray (default: all)."),
    experiment: str = typer.Option(None, help="MLflow experiment (default: the spec's name)."),
) -> None:
    """Run a sweep in-process on embedded defaults (local Ray, sqlite MLflow) and print the report."""
    from sweeps.report import report_markdown
    from sweeps.runner import run_sweep

    spec = load_spec_or_exit(spec_path)
    sweep_id = sweep_id or uuid.uuid4().hex[:12]
    tracking_uri = default_tracking_uri()
    console.print(f"sweep [bold]{spec.name}[/bold] id {sweep_id}: {spec.trial_count()} trials, "
                  f"MLflow {tracking_uri}")
    view = LiveView(spec.trial_count(), spec.name)
    started = time.perf_counter()
    with view.live:
        outcome = run_sweep(spec, sweep_id=sweep_id, sweep_root=default_sweep_root(),
                            tracking_uri=tracking_uri, num_cpus=num_cpus, sinks=[view],
                            experiment_name=experiment)
    console.print(report_markdown(outcome.report))
    console.print(f"{outcome.status.state} in {time.perf_counter() - started:.1f} s; parent run "
                  f"{outcome.parent_run_id} (experiment {outcome.experiment_id})")
    console.print(f"compare in the MLflow UI: mlflow ui --backend-store-uri {tracking_uri}  then "
                  f"http://127.0.0.1:5000/#/experiments/{outcome.experiment_id}/runs")
    if os.environ.get("KSWEEP_PRINT_REPORT_JSON"):
        console.print_json(json.dumps(outcome.report))
    raise typer.Exit(0 if outcome.status.state == "succeeded" else 1)


def validate_command(
    spec_path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Sweep spec YAML/JSON."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Validate a spec and print its trial plan (count, epoch budget, resources); runs nothing."""
    from sweeps.plan import build_plan, render_plan

    spec = load_spec_or_exit(spec_path)
    plan = build_plan(spec)
    if as_json:
        console.print_json(json.dumps(plan.to_dict()))
    else:
        render_plan(plan, console)

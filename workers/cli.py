"""``ksweep train CONFIG.yaml``: one trial without Ray, logged to MLflow."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from workers.tracking import default_tracking_uri
from workers.train import TrialCheckFailed, TrialDiverged, load_trial_config
from workers.trial import run_logged_trial

console = Console()

SUMMARY_KEYS = (
    "train/loss", "val/loss", "val/recon_uniform", "val/recon_token_weighted", "val/recon_ncc",
    "val/kl", "val/kappa_mean", "val/kappa_p90", "val/latent_nmi", "val/latent_ari",
    "val/mutual_info", "val/active_units", "perf/tokens_per_second",
)


def default_sweep_root() -> Path:
    """KSWEEP_SWEEP_ROOT (Tune state and caches), default ./.ksweep, as an absolute path."""
    return Path(os.environ.get("KSWEEP_SWEEP_ROOT", ".ksweep")).resolve()


def format_validation_error(error: ValidationError) -> str:
    """One line per problem: the dotted field path and the message."""
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {path}: {item['msg']}")
    return "\n".join(lines)


def train_command(
    config_path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Trial config YAML/JSON."),
    experiment: str = typer.Option("ksweep-trials", help="MLflow experiment name."),
) -> None:
    """Train one trial (no Ray) and log it to MLflow (MLFLOW_TRACKING_URI, default ./mlflow.db)."""
    try:
        config = load_trial_config(config_path)
    except ValidationError as error:
        console.print(f"[red]invalid trial config {config_path}:[/red]\n{format_validation_error(error)}")
        raise typer.Exit(2) from None
    except ValueError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    tracking_uri = default_tracking_uri()
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"), TimeRemainingColumn(), console=console,
    )
    with progress:
        task = progress.add_task("setting up", total=config.training.epochs, status="")

        def on_epoch(trainer, epoch, metrics):
            progress.update(
                task, completed=epoch, description="training",
                status=f"val/loss {metrics['val/loss']:.4f}  nmi {metrics['val/latent_nmi']:.3f}",
            )

        try:
            trainer, logger = run_logged_trial(
                config, tracking_uri, experiment, default_sweep_root(), on_epoch=on_epoch,
                on_start=lambda trainer, logger: progress.update(task, description="training"),
            )
        except (TrialDiverged, TrialCheckFailed) as error:
            console.print(f"[red]trial failed:[/red] {error}")
            raise typer.Exit(1) from None
    table = Table(title=f"{config.model.family} / {config.loss_stack.label} / alpha {config.alpha:g}")
    table.add_column("metric")
    table.add_column("final", justify="right")
    for key in SUMMARY_KEYS:
        if key in trainer.history:
            table.add_row(key, f"{trainer.history[key][-1]:.4g}")
    console.print(table)
    console.print(f"c_base = {trainer.c_base:.6g} ({trainer.base.kind} base)")
    console.print(f"MLflow run {logger.run_id} in experiment {logger.experiment_id} at {tracking_uri}")
    console.print(f"open the UI: mlflow ui --backend-store-uri {tracking_uri}")

"""The ``ksweep`` commands that train, in-process and without the service:
``ksweep train CONFIG`` (one trial, no Ray) and ``ksweep sweep run SPEC`` (a whole sweep).

Only this module reaches the trainer, Ray Tune and matplotlib, and only inside the
commands, so ``ksweep --help`` and the REST client commands start without them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import typer
from rich.console import Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from ksweep.cli.common import (
    console,
    default_data_root,
    default_model_root,
    default_sweep_root,
    format_validation_error,
    load_spec_or_exit,
    plan_or_exit,
)
from ksweep.progress import format_eta
from service.orchestrator.driver_env import LOCAL_RAY_ENV, TUNE_ENV
from sweeps.status import SweepState, SweepStatus, TrialState
from workers.contract import (
    ELBO_BETA_PARAM,
    LOCAL_MLFLOW_UI,
    PERF_TOKENS_PER_SECOND,
    TRAIN_LOSS,
    TRAIN_TARGET_LENGTH_PARAM,
    VAL,
    VAL_ACTIVE_UNITS,
    VAL_ELBO,
    VAL_KAPPA_MEAN,
    VAL_KL,
    VAL_LATENT_ARI,
    VAL_LATENT_NMI,
    VAL_LOSS,
    VAL_MUTUAL_INFO,
    default_tracking_uri,
    metric_name,
    mlflow_ui_url,
)

# The final values ``ksweep train`` prints.
SUMMARY_KEYS: tuple[str, ...] = (
    TRAIN_LOSS, VAL_LOSS, *(metric_name(VAL, name) for name in (
        "recon_uniform", "recon_token_weighted", "recon_ncc")),
    VAL_KL, VAL_KAPPA_MEAN, metric_name(VAL, "kappa_p90"), VAL_LATENT_NMI, VAL_LATENT_ARI,
    VAL_MUTUAL_INFO, VAL_ACTIVE_UNITS, PERF_TOKENS_PER_SECOND,
)
COUNTER_COLUMNS: tuple[str, ...] = tuple(state.value for state in TrialState)  # the live view's, in order
sweep_app = typer.Typer(help="Run sweeps in-process (no service).", no_args_is_help=True)


def train_command(
    config_path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Trial config YAML/JSON."),
    experiment: str = typer.Option("ksweep-trials", help="MLflow experiment name."),
    plots: bool = typer.Option(True, help="Log the trial's five PNGs (kappa histograms, curves, "
                               "profiles); a sweep draws them only with tracking.trial_plots."),
) -> None:
    """Train one trial (no Ray) and log it to MLflow (MLFLOW_TRACKING_URI, default ./mlflow.db)."""
    from pydantic import ValidationError

    from workers.train.config import load_trial_config  # torch-free: a bad config fails at once

    try:
        config = load_trial_config(config_path)
    except ValidationError as error:
        console.print(f"[red]invalid trial config {config_path}:[/red]\n{format_validation_error(error)}")
        raise typer.Exit(2) from None
    except ValueError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    from workers.imports import heavy_imports

    with heavy_imports():
        from workers.train import TrialCheckFailed, TrialDiverged
        from workers.trial import run_constants, run_logged_trial

    config = _resolve_trial_data(config)
    tracking_uri = default_tracking_uri()
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"), TimeRemainingColumn(), console=console,
    )
    with progress:
        task = progress.add_task("setting up", total=config.training.epochs, status="")

        def on_epoch(trainer: Any, epoch: int, metrics: dict[str, float]) -> None:
            progress.update(
                task, completed=epoch, description="training",
                status=f"val/loss {metrics[VAL_LOSS]:.4f}  "
                + (f"nmi {metrics[VAL_LATENT_NMI]:.3f}" if VAL_LATENT_NMI in metrics
                   else f"elbo {metrics.get(VAL_ELBO, float('nan')):.3f}"),
            )

        try:
            trainer, logger = run_logged_trial(
                config, tracking_uri, experiment, default_sweep_root(), on_epoch=on_epoch,
                on_start=lambda trainer, logger: progress.update(task, description="training"),
                plots=plots,
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
    constants = run_constants(trainer)
    console.print(f"{trainer.total_steps} optimizer steps; mean target length "
                  f"{constants[TRAIN_TARGET_LENGTH_PARAM]:.4g}; beta in ELBO units "
                  f"{constants[ELBO_BETA_PARAM]:.4g}")
    for overrun in config.schedule_overruns(trainer.total_steps):
        console.print(f"[yellow]warning:[/yellow] {overrun} did not finish within the run's "
                      f"{trainer.total_steps} steps")
    console.print(f"MLflow run {logger.run_id} in experiment {logger.experiment_id} at {tracking_uri}")
    console.print(f"open the UI: mlflow ui --backend-store-uri {tracking_uri}")


def _resolve_trial_data(config: Any) -> Any:
    """A trial config naming a dataset, resolved against KSWEEP_DATA_ROOT (exit 2 if it cannot be)."""
    from workers.data.config import DatasetDataConfig
    from workers.datasets.resolve import DatasetResolutionError, resolve_dataset
    from workers.datasets.store import DatasetStore
    from workers.zfree.resolve import resolve_model

    if not isinstance(config.data, DatasetDataConfig):
        return config
    try:
        data = resolve_dataset(config.data, default_data_root(), field="data")
        tokenizer = DatasetStore(Path(str(data.root))).get(data.dataset).tokenizer
        base = resolve_model(config.base, default_model_root(), dataset_name=data.dataset,
                             dataset_tokenizer=tokenizer, field="base")
        return config.model_copy(update={"data": data, "base": base})
    except DatasetResolutionError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None


class LiveView:
    """A progress sink drawing the trial counters, best-so-far and ETA."""

    def __init__(self, total: int, title: str) -> None:
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("ETA {task.fields[eta]}"))
        self.task = self.progress.add_task(title, total=total, eta="-")
        self.live = Live(self._render(None), console=console, refresh_per_second=4)

    def _render(self, status: SweepStatus | None) -> Group:
        table = Table(show_header=True, header_style="bold")
        for column in (*COUNTER_COLUMNS, "best"):
            table.add_column(column, justify="right")
        if status is not None:
            best = "-" if status.best_value is None else f"{status.best_metric} {status.best_value:.4f}"
            table.add_row(*(str(getattr(status, k)) for k in COUNTER_COLUMNS), best)
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
    # This process is the sweep's driver: Tune reads these knobs from its environment, and a
    # local Ray started here listens on loopback only and prestarts no idle workers (both
    # before Ray is imported).
    for name, value in (TUNE_ENV | ({} if os.environ.get("RAY_ADDRESS") else LOCAL_RAY_ENV)).items():
        os.environ.setdefault(name, value)
    from workers.imports import heavy_imports

    with heavy_imports():
        from service.settings import get_settings
        from sweeps.report.build import report_markdown
        from sweeps.tune.runner import SweepSettings, run_sweep
        from sweeps.tune.setup import end_driver_process

    spec = load_spec_or_exit(spec_path)
    plan = plan_or_exit(spec, spec_path)
    sweep_id = sweep_id or uuid.uuid4().hex[:12]
    tracking_uri = default_tracking_uri()
    console.print(f"sweep [bold]{spec.name}[/bold] id {sweep_id}: {plan.trial_count} trials, "
                  f"MLflow {tracking_uri}")
    view = LiveView(plan.trial_count, spec.name)
    started = time.perf_counter()
    from workers.datasets.resolve import DatasetResolutionError

    try:
        with view.live:
            outcome = run_sweep(spec, plan, SweepSettings(
                sweep_id=sweep_id, sweep_root=default_sweep_root(), tracking_uri=tracking_uri,
                num_cpus=num_cpus, sinks=[view], experiment_name=experiment,
                data_root=default_data_root(), mlflow_ui_url=get_settings().mlflow_ui_url,
                model_root=default_model_root()))
    except DatasetResolutionError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    finally:
        end_driver_process()
    console.print(report_markdown(outcome.report))
    console.print(f"{outcome.status.state} in {time.perf_counter() - started:.1f} s; parent run "
                  f"{outcome.parent_run_id} (experiment {outcome.experiment_id})")
    console.print(f"compare in the MLflow UI: mlflow ui --backend-store-uri {tracking_uri}  then "
                  f"{mlflow_ui_url(LOCAL_MLFLOW_UI, outcome.experiment_id)}")
    from ksweep.settings import client_settings

    if client_settings().print_report_json:
        console.print_json(json.dumps(outcome.report))
    raise typer.Exit(0 if outcome.status.state == SweepState.SUCCEEDED else 1)

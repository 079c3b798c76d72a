"""What every ``ksweep`` command shares: the console, spec loading with field-path errors,
and ``ksweep validate SPEC`` (the dry-run plan). Torch-free."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from pydantic import ValidationError
from rich.console import Console

if TYPE_CHECKING:  # the spec model loads with the first command that reads a spec, not for --help
    from sweeps.plan.build import SweepPlan
    from sweeps.spec import SweepSpec

console = Console()


def default_sweep_root() -> Path:
    """KSWEEP_SWEEP_ROOT (Tune state and caches), default ./.ksweep, as an absolute path."""
    return Path(os.environ.get("KSWEEP_SWEEP_ROOT", ".ksweep")).resolve()


def default_data_root() -> Path:
    """KSWEEP_DATA_ROOT (the dataset store), default $KSWEEP_SWEEP_ROOT/datasets, absolute."""
    configured = os.environ.get("KSWEEP_DATA_ROOT")
    return Path(configured).resolve() if configured else default_sweep_root() / "datasets"


def default_model_root() -> Path:
    """KSWEEP_MODEL_ROOT (the model store), default $KSWEEP_SWEEP_ROOT/models, absolute."""
    configured = os.environ.get("KSWEEP_MODEL_ROOT")
    return Path(configured).resolve() if configured else default_sweep_root() / "models"


def format_validation_error(error: ValidationError) -> str:
    """One line per problem: the dotted field path and the message."""
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {path}: {item['msg']}")
    return "\n".join(lines)


def load_spec_or_exit(path: Path) -> SweepSpec:
    """Load a spec file (YAML 1.2 or JSON, bounded: :mod:`workers.yaml_loader`) and validate it
    as strictly as the API does, printing every problem with its field path (exit 2)."""
    from sweeps.spec import SweepSpec
    from workers.yaml_loader import read_spec_file

    try:
        return SweepSpec.model_validate(read_spec_file(path), strict=True)
    except ValidationError as error:
        console.print(f"[red]invalid sweep spec {path}:[/red]\n{format_validation_error(error)}")
        raise typer.Exit(2) from None
    except (ValueError, OSError) as error:
        console.print(f"[red]{path}: {error}[/red]")
        raise typer.Exit(2) from None


def plan_or_exit(spec: SweepSpec, path: Path) -> SweepPlan:
    """The spec's plan, built once; a plan over ``budget.max_trials`` is printed as
    :func:`load_spec_or_exit` prints an invalid spec (exit 2). A dataset's train split is read
    from KSWEEP_DATA_ROOT for the plan's steps and ELBO units."""
    from sweeps.plan.budget import build_plan_within_budget
    from workers.datasets.train_facts import train_facts

    try:
        return build_plan_within_budget(spec, train_facts(spec.template.data, default_data_root()))
    except ValidationError as error:
        console.print(f"[red]invalid sweep spec {path}:[/red]\n{format_validation_error(error)}")
        raise typer.Exit(2) from None


def _pilot_report(pilot: str) -> dict[str, Any]:
    """A pilot sweep's report.json: a file's, else the service's (KSWEEP_URL) for that id."""
    path = Path(pilot)
    if path.is_file():
        try:
            report: dict[str, Any] = json.loads(path.read_text())
            return report
        except (OSError, ValueError) as error:
            console.print(f"[red]--pilot {pilot}: not a report.json ({error})[/red]")
            raise typer.Exit(2) from None
    from ksweep.cli.client import request_or_exit

    answer: dict[str, Any] = request_or_exit("GET", f"/sweeps/{pilot}/report").json()
    return answer


def pilot_power_or_exit(spec: SweepSpec, pilot: str) -> dict[str, Any]:
    """The spec's power from the pilot's paired SDs; a pilot that cannot stand for the spec is
    printed with why (exit 2)."""
    from sweeps.report.power_plan import PilotMismatch, pilot_power

    try:
        return pilot_power(spec, _pilot_report(pilot))
    except PilotMismatch as error:
        console.print(f"[red]--pilot {pilot}: {error}[/red]")
        raise typer.Exit(2) from None


def validate_command(
    spec_path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Sweep spec YAML/JSON."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    pilot: str = typer.Option(None, "--pilot", metavar="ID", help="A pilot sweep's id (its "
                              "report read from the service) or its report.json: the effect the "
                              "spec's seeds detect and the seeds analysis.min_effect needs."),
) -> None:
    """Validate a spec and print its trial plan (count, each trial's optimizer steps and beta in
    ELBO units, the epoch budget, resources, schedules that do not finish); runs nothing.
    With --pilot, also the power of its primary contrasts from the pilot's paired SDs."""
    from sweeps.plan.build import render_plan

    spec = load_spec_or_exit(spec_path)
    plan = plan_or_exit(spec, spec_path)
    power = plan.power = None if pilot is None else pilot_power_or_exit(spec, pilot)
    if as_json:
        console.print_json(json.dumps(plan.to_dict()))
        return
    render_plan(plan, console)
    if power is not None:
        from rich.text import Text

        from sweeps.report.power_plan import pilot_lines

        console.print(Text("Power by design", style="bold"))
        for line in pilot_lines(power):
            console.print(Text(f"- {line}"))

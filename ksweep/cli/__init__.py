"""The ``ksweep`` command line: one entry point for every part.

The REST client commands (:mod:`.client`) and ``validate`` (:mod:`.common`) are torch-free;
the commands that train (:mod:`.training`) import the trainer only when they run.
"""

from __future__ import annotations

import typer

from ksweep.cli.client import (
    cancel_command,
    export_command,
    report_command,
    status_command,
    submit_command,
    watch_command,
)
from ksweep.cli.common import validate_command
from ksweep.cli.datasets import data_app
from ksweep.cli.growth import extend_command
from ksweep.cli.models import model_app
from ksweep.cli.server import serve_command
from ksweep.cli.training import sweep_app, train_command

app = typer.Typer(help="kappa-sweep: sweeps over alpha and loss stacks for CVAEs.", no_args_is_help=True)
app.command("train")(train_command)
app.add_typer(sweep_app, name="sweep")
app.add_typer(model_app, name="model")
app.command("validate")(validate_command)
app.command("serve")(serve_command)
app.command("submit")(submit_command)
app.command("status")(status_command)
app.command("watch")(watch_command)
app.command("cancel")(cancel_command)
app.command("extend")(extend_command)
app.command("report")(report_command)
app.command("export")(export_command)
app.add_typer(data_app, name="data")


@app.command("objectives")
def objectives_command(demo: bool = typer.Option(False, help="Show kappa_alpha on synthetic surprisal.")) -> None:
    """List the loss terms and presets (and optionally demonstrate the objective family)."""
    from ksweep.cli.objectives_demo import print_demo, print_registry

    print_registry()
    if demo:
        print_demo()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()

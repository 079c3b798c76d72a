"""``ksweep model add PATH --name NAME`` and ``ksweep model list``: the model store.

The store is local (``KSWEEP_MODEL_ROOT``, default ``$KSWEEP_SWEEP_ROOT/models``); the
tokenizer fingerprint is computed with transformers (offline) only inside ``add``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from ksweep.cli.common import console, default_model_root

if TYPE_CHECKING:  # the registry loads when a command runs, not for --help
    from workers.lm.registry import ModelStore

model_app = typer.Typer(help="Register local causal language models (the causal_lm base).",
                        no_args_is_help=True)


def _store() -> ModelStore:
    from workers.lm.registry import ModelStore

    return ModelStore(default_model_root())


@model_app.command("add")
def add_command(
    path: Path = typer.Argument(..., help="A Hugging Face model folder (config.json + "
                                "*.safetensors + tokenizer files) or a .gguf file."),
    name: str = typer.Option(..., "--name", help="The name specs use (base.model)."),
    owner: str = typer.Option("local", help="Recorded with the model."),
    replace: bool = typer.Option(False, help="Point an existing name at other content."),
) -> None:
    """Copy a model into the store, hash it and fingerprint its tokenizer (offline)."""
    from workers.lm.loading import fingerprint_files
    from workers.lm.registry import ModelError

    store = _store()
    try:
        record = store.add(path, name=name, owner=owner, replace=replace,
                           fingerprint=fingerprint_files)
    except ModelError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    console.print(f"registered model [bold]{record.name}[/bold] ({record.format}, "
                  f"sha256 {record.sha256[:12]}, {record.bytes / 1e6:.1f} MB, vocabulary "
                  f"{record.vocab_size}, tokenizer {(record.tokenizer_sha256 or '?')[:12]}) "
                  f"under {store.root}")


@model_app.command("list")
def list_command(as_json: bool = typer.Option(False, "--json", help="Full records as JSON.")) -> None:
    """The registered models."""
    from workers.lm.registry import dumps, record_summary

    records = _store().list()
    if as_json:
        typer.echo(dumps(records))
        return
    table = Table("name", "format", "sha256", "bytes", "vocab_size", "tokenizer", "created_at")
    for record in records:
        table.add_row(*(str(v) for v in record_summary(record).values()))
    console.print(table if records else "no models registered (ksweep model add PATH --name NAME)")

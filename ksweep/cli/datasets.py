"""``ksweep data add | list | show | rm``: the dataset registry, over REST or local (and ``plant``,
:mod:`ksweep.cli.planted`, local only).

The service when ``KSWEEP_URL`` is set or with ``--service``, else the local store
(:mod:`ksweep.cli.dataset_local`, which says why). Over REST, ``add`` streams ONE Parquet,
Arrow or JSONL file as the raw request body. A Hugging Face ``save_to_disk`` folder is first
converted to Parquet here, on the client, from its Arrow files (:mod:`workers.datasets.hf`;
pyarrow is imported only then). ``--tokenizer MODEL`` tokenizes text with a registered model's
tokenizer: the service's model store, or the local one (``ksweep model add``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.table import Table

from ksweep.cli import dataset_local
from ksweep.cli.client import console, request_or_exit
from ksweep.cli.planted import plant_command
from workers.datasets.formats import BY_NAME, SUFFIX_FORMATS

data_app = typer.Typer(help="Register, list, show and remove datasets (docs/guide/datasets.md); "
                       "plant a positive control (docs/guide/planted-control.md).",
                       no_args_is_help=True)
data_app.command("plant")(plant_command)
CHUNK = 1 << 20


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


LOCAL_OPTION = typer.Option(
    None, "--local/--service", help="The local store (KSWEEP_DATA_ROOT) or the service "
    "(KSWEEP_URL). Default: the service when KSWEEP_URL is set, else the local store.")


def _upload(path: Path, name: str, replace: bool, filename: str, tokenizer: str | None) -> dict:
    fmt = SUFFIX_FORMATS[path.suffix.lower()]
    headers = {"Content-Type": BY_NAME[fmt].media_types[0],
               "Content-Length": str(path.stat().st_size)}
    params = {"name": name, "filename": filename, **({"replace": "true"} if replace else {}),
              **({"tokenizer": tokenizer} if tokenizer else {})}
    response = request_or_exit("POST", "/datasets", params=params, content=_chunks(path),
                               headers=headers, timeout=None)
    return response.json()


def _print_summary(record: dict) -> None:
    summary = record["summary"]
    console.print(f"[bold]{record['name']}[/bold]  owner {record['owner']}  sha256 "
                  f"{record['sha256']}  {record['rows']} rows  {record['bytes']} bytes stored"
                  + (f"  tokenizer {record['tokenizer']}" if record.get("tokenizer") else ""))
    table = Table("split", "rows", "y tokens", "x tokens")
    for split, rows in summary["rows_per_split"].items():
        tokens = summary["tokens"][split]
        table.add_row(split, str(rows), str(tokens["y"]), str(tokens["x"]))
    console.print(table)
    console.print(f"vocabulary size {summary['vocab_size']}; y length "
                  + ", ".join(f"{k} {v:g}" for k, v in summary["y_length"].items())
                  + "; x length " + ", ".join(f"{k} {v:g}" for k, v in summary["x_length"].items()))
    if summary.get("labels") is not None:
        console.print(f"labels ({summary['label_classes']} classes): "
                      + ", ".join(f"{k} {v}" for k, v in summary["labels"].items()))
    if summary.get("groups") is not None:
        console.print("groups: " + ", ".join(f"{k} {v}" for k, v in summary["groups"].items()))
    console.print("base_nll: " + ("given (base.kind: precomputed possible)"
                                  if summary["has_base_nll"] else "absent"))
    if summary.get("ignored_columns"):
        console.print(f"[yellow]ignored columns: {', '.join(summary['ignored_columns'])}[/yellow]")


def _register(path: Path, name: str, replace: bool, filename: str, tokenizer: str | None,
              service: bool) -> dict:
    if path.suffix.lower() not in SUFFIX_FORMATS:
        console.print(f"[red]{path.name}: unknown file type {path.suffix!r}[/red]; give a "
                      ".parquet, .arrow/.feather or .jsonl file, or a save_to_disk folder")
        raise typer.Exit(2)
    if service:
        return _upload(path, name, replace, filename, tokenizer)
    return dataset_local.add_local(path, name, replace, filename, tokenizer)


@data_app.command("add")
def add_command(
    source: Path = typer.Argument(..., exists=True, help="A .parquet, .arrow/.feather or .jsonl "
                                  "file, or a Hugging Face save_to_disk folder."),
    name: str = typer.Option(..., "--name", help="The dataset's name in the registry."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Tokenize the text columns (x_text / y_text) with this "
        "registered model's tokenizer (`ksweep model add`), instead of bytes."),
    replace: bool = typer.Option(False, "--replace", help="Point an existing name at new content."),
    local: bool | None = LOCAL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
) -> None:
    """Validate and register a dataset (nothing is stored if it is refused)."""
    service = dataset_local.use_service(local)
    if source.is_dir():
        from workers.datasets.hf import convert_saved_folder, is_saved_folder
        from workers.datasets.limits import DatasetError

        if not is_saved_folder(source):
            console.print(f"[red]{source.name}: a folder, but not a save_to_disk folder[/red] "
                          "(no state.json or dataset_dict.json)")
            raise typer.Exit(2)
        with tempfile.TemporaryDirectory(prefix="ksweep-data-") as tmp:
            try:
                parquet = convert_saved_folder(source, Path(tmp) / f"{source.name}.parquet")
            except DatasetError as err:
                console.print(f"[red]{err}[/red]")
                raise typer.Exit(2) from None
            record = _register(parquet, name, replace, f"{source.name}/ (save_to_disk)",
                               tokenizer, service)
    else:
        record = _register(source, name, replace, source.name, tokenizer, service)
    if as_json:
        print(json.dumps(record, indent=1))
    else:
        _print_summary(record)
        console.print(f"registered in {_where(service)}", highlight=False)


def _where(service: bool) -> str:
    if not service:
        return dataset_local.where(False)
    from ksweep.settings import ClientSettings

    return dataset_local.where(True, ClientSettings().url)


def _short_tokenizer(tokenizer: str | None) -> str:
    """``smollm2@31a935f1`` for ``smollm2@<64 hex>``; ``bytes`` as it is."""
    name, _, fingerprint = (tokenizer or "").partition("@")
    return f"{name}@{fingerprint[:8]}" if fingerprint else name


@data_app.command("list")
def list_command(owner: str | None = typer.Option(None, help="Only this owner's."),
                 local: bool | None = LOCAL_OPTION,
                 as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The registered datasets."""
    service = dataset_local.use_service(local)
    if service:
        records = request_or_exit("GET", "/datasets",
                                  params={"owner": owner} if owner else None).json()
    else:
        records = [r for r in dataset_local.list_local() if owner is None or r["owner"] == owner]
    if as_json:
        print(json.dumps(records, indent=1))
        return
    table = Table("name", "owner", "rows", "sha256", "stored bytes", "tokenizer", "registered",
                  title=f"datasets in {_where(service)}")
    for r in records:
        table.add_row(r["name"], r["owner"], str(r["rows"]), r["sha256"][:12], str(r["bytes"]),
                      _short_tokenizer(r.get("tokenizer")), r["created_at"][:19])
    console.print(table)


@data_app.command("show")
def show_command(name: str = typer.Argument(...), local: bool | None = LOCAL_OPTION,
                 as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """One dataset's record and summary."""
    service = dataset_local.use_service(local)
    record = (request_or_exit("GET", f"/datasets/{name}").json() if service
              else dataset_local.show_local(name))
    if as_json:
        print(json.dumps(record, indent=1))
    else:
        _print_summary(record)


@data_app.command("rm")
def rm_command(name: str = typer.Argument(...), local: bool | None = LOCAL_OPTION) -> None:
    """Remove a dataset name (the service refuses while a queued or running sweep names it)."""
    service = dataset_local.use_service(local)
    record = (request_or_exit("DELETE", f"/datasets/{name}").json() if service
              else dataset_local.rm_local(name))
    console.print(f"removed {record['name']} (sha256 {record['sha256'][:12]}) from "
                  f"{_where(service)}", highlight=False)

"""``ksweep data`` on the local dataset store, without a service.

Which store a ``ksweep data`` command uses: the service when ``KSWEEP_URL`` is set (or with
``--service``), else the local store under ``KSWEEP_DATA_ROOT`` (default
``$KSWEEP_SWEEP_ROOT/datasets``), which is the store ``ksweep sweep run`` and a ``ksweep serve``
started with the same settings read. ``--local`` forces it. Locally the file is read,
validated and stored in this process (no size caps beyond the dataset limits, no quota), and
datasets belong to the owner ``local``, the owner of a local service's generated token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ksweep.cli.common import console, default_data_root, default_model_root


def use_service(local: bool | None) -> bool:
    """``--local`` / ``--service`` when given, else whether ``KSWEEP_URL`` is set."""
    if local is not None:
        return not local
    from ksweep.settings import client_settings

    return client_settings().url_given


def _store():  # noqa: ANN202 - the store module is imported only by the local commands
    from workers.datasets.store import DatasetStore

    return DatasetStore(default_data_root())


def _refused(error: Exception) -> typer.Exit:
    console.print(f"[red]{error}[/red]", highlight=False)
    return typer.Exit(2)


def model_tokenizer(name: str) -> Any:
    """The tokenizer of the model registered as ``name`` in the local model store (exit 2 if
    it is not there or its tokenizer changed)."""
    from workers.lm.registry import ModelError
    from workers.lm.tokenizer import ModelTextTokenizer

    try:
        return ModelTextTokenizer.registered(default_model_root(), name)
    except ModelError as error:
        raise _refused(error) from None


def add_local(path: Path, name: str, replace: bool, source_name: str,
              tokenizer: str | None) -> dict[str, Any]:
    """Read, validate and register one file in the local store; the record as JSON data."""
    from service.settings import LOCAL_OWNER
    from workers.datasets.limits import DatasetError
    from workers.datasets.store import DatasetConflict
    from workers.datasets.table import canonicalize, read_table, tokenizer_of

    text_tokenizer = model_tokenizer(tokenizer) if tokenizer is not None else None
    try:
        table = read_table(path, source_name=source_name)
        canonical = canonicalize(table, source_name, tokenizer=text_tokenizer)
        record = _store().add(canonical, name=name, owner=LOCAL_OWNER,
                              tokenizer=tokenizer_of(canonical), replace=replace)
    except DatasetError as error:
        raise _refused(error) from None
    except DatasetConflict as error:
        raise _refused(f"{error} (ksweep data add --replace)") from None
    return record.model_dump(mode="json")


def list_local() -> list[dict[str, Any]]:
    """Every record of the local store, by name."""
    return [r.model_dump(mode="json") for r in _store().list()]


def show_local(name: str) -> dict[str, Any]:
    """One record of the local store (exit 2 naming the problem when there is none)."""
    from workers.datasets.limits import DatasetError
    from workers.datasets.store import DatasetNotFound

    try:
        return _store().get(name).model_dump(mode="json")
    except (DatasetNotFound, DatasetError) as error:
        raise _refused(error) from None


def rm_local(name: str) -> dict[str, Any]:
    """Remove a name from the local store. Nothing here knows which sweeps are running: a
    ``ksweep sweep run`` in progress that reads it may fail (the service refuses instead)."""
    from workers.datasets.limits import DatasetError
    from workers.datasets.store import DatasetNotFound

    try:
        return _store().remove(name).model_dump(mode="json")
    except (DatasetNotFound, DatasetError) as error:
        raise _refused(error) from None


def where(service: bool, base_url: str | None = None) -> str:
    """The words naming the store a command used."""
    return (f"the service at {base_url}" if service
            else f"the local store {default_data_root()}")

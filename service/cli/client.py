"""The CLI client of the service: ``ksweep submit | status | watch | cancel | report``.

It talks to ``KSWEEP_URL`` with ``KSWEEP_TOKEN``; with no token set it falls back to the
token a local ``ksweep serve`` generated under ``KSWEEP_SWEEP_ROOT`` (owner ``local``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.cli.common import format_eta, load_spec_or_exit
from service.settings import Settings, get_settings
from workers.contract import TERMINAL_SWEEP_STATES, SweepState

console = Console()
# `ksweep watch` exits with the outcome: scripts can tell success from failure or cancel.
EXIT_CODES = {SweepState.SUCCEEDED: 0, SweepState.FAILED: 1, SweepState.CANCELLED: 3}


class ServiceClient:
    """A thin httpx client for ``/api/v1`` that turns problem details into readable errors."""

    def __init__(self, settings: Settings) -> None:
        headers = {}
        token = settings.token
        if not token and settings.local_token_path.is_file():
            token = settings.local_token_path.read_text().strip()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base = settings.url.rstrip("/") + "/api/v1"
        self.http = httpx.Client(headers=headers, timeout=60)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, self.base + path, **kwargs)
        except httpx.TransportError as error:
            console.print(f"[red]cannot reach the service at {self.base}: {error}[/red] "
                          "(is `ksweep serve` running? KSWEEP_URL)")
            raise typer.Exit(4) from None
        if response.status_code >= 400:
            _print_problem(response)
            raise typer.Exit(2 if response.status_code in (400, 404, 409, 413, 422) else 4)
        return response


def _print_problem(response: httpx.Response) -> None:
    try:
        problem = response.json()
    except ValueError:
        console.print(f"[red]HTTP {response.status_code}: {response.text[:500]}[/red]")
        return
    console.print(f"[red]{problem.get('title', 'error')} ({response.status_code}):[/red] "
                  f"{problem.get('detail') or ''}")
    for item in problem.get("errors") or []:
        console.print(f"  {item['field']}: {item['message']}")


def _client() -> ServiceClient:
    return ServiceClient(get_settings())


def _counter_line(sweep: dict[str, Any]) -> str:
    c = sweep["counters"]
    return (f"{c['done']} done, {c['running']} running, {c['pending']} pending, "
            f"{c['stopped']} stopped, {c['failed']} failed of {c['total']}")


def _best(sweep: dict[str, Any]) -> str:
    best = sweep["best"]
    return "-" if best.get("value") is None else f"{best['metric']} {best['value']:.4f}"


def submit_command(
    spec_path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Sweep spec YAML/JSON."),
    idempotency_key: str = typer.Option(None, help="Resubmitting with the same key is safe."),
) -> None:
    """Submit a sweep; prints its id and URLs."""
    spec = load_spec_or_exit(spec_path)
    client = _client()
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    sweep = client.request("POST", "/sweeps", json=spec.model_dump(mode="json"),
                           headers=headers).json()
    console.print(f"sweep [bold]{sweep['id']}[/bold] ({sweep['name']}): {sweep['state']}, "
                  f"{sweep['counters']['total']} trials")
    console.print(f"  status: {client.base}/sweeps/{sweep['id']}")
    console.print(f"  watch:  ksweep watch {sweep['id']}")
    print(sweep["id"])


def status_command(sweep_id: str = typer.Argument(None, help="A sweep id; omit to list sweeps.")) -> None:
    """One sweep's state, counters, best so far and ETA; or the list of sweeps."""
    client = _client()
    if sweep_id is None:
        page = client.request("GET", "/sweeps", params={"limit": 50}).json()
        table = Table(title=f"sweeps ({page['total']})")
        for column in ("id", "name", "owner", "state", "trials", "best", "created"):
            table.add_column(column)
        for sweep in page["items"]:
            c = sweep["counters"]
            table.add_row(sweep["id"], sweep["name"], sweep["owner"], sweep["state"],
                          f"{c['done'] + c['stopped'] + c['failed']}/{c['total']}", _best(sweep),
                          sweep["created_at"][:19])
        console.print(table)
        return
    sweep = client.request("GET", f"/sweeps/{sweep_id}").json()
    console.print(f"sweep [bold]{sweep['id']}[/bold] ({sweep['name']}, owner {sweep['owner']}): "
                  f"[bold]{sweep['state']}[/bold]")
    console.print(f"  trials: {_counter_line(sweep)}")
    console.print(f"  best:   {_best(sweep)}   ETA {format_eta(sweep['eta_seconds'])}")
    if sweep["mlflow"]["ui_url"]:
        console.print(f"  MLflow: {sweep['mlflow']['ui_url']}")
    if sweep["error"]:
        console.print(f"  [red]error:[/red] {sweep['error']}")


def watch_command(
    sweep_id: str = typer.Argument(..., help="The sweep to follow."),
    interval: float = typer.Option(2.0, help="Seconds between polls."),
) -> None:
    """A live progress bar until the sweep ends; exit 0 succeeded, 1 failed, 3 cancelled."""
    client = _client()
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[state]}"), TextColumn("best {task.fields[best]}"),
                        TextColumn("ETA {task.fields[eta]}"), TimeElapsedColumn(), console=console)
    with progress:
        task = progress.add_task(sweep_id, total=None, state="", best="-", eta="-")
        while True:
            sweep = client.request("GET", f"/sweeps/{sweep_id}").json()
            c = sweep["counters"]
            progress.update(task, description=sweep["name"], total=c["total"] or None,
                            completed=c["done"] + c["stopped"] + c["failed"], state=sweep["state"],
                            best=_best(sweep), eta=format_eta(sweep["eta_seconds"]))
            if sweep["state"] in TERMINAL_SWEEP_STATES:
                break
            time.sleep(interval)
    console.print(f"sweep {sweep_id} {sweep['state']}: {_counter_line(sweep)}")
    if sweep["error"]:
        console.print(f"[red]error:[/red] {sweep['error']}")
    raise typer.Exit(EXIT_CODES[sweep["state"]])


def cancel_command(sweep_id: str = typer.Argument(..., help="The sweep to cancel.")) -> None:
    """Cancel a sweep (its driver and trials stop; finished trials stay in MLflow)."""
    sweep = _client().request("POST", f"/sweeps/{sweep_id}/cancel").json()
    console.print(f"sweep {sweep_id}: {sweep['state']} ({_counter_line(sweep)})")


def report_command(
    sweep_id: str = typer.Argument(..., help="A finished sweep."),
    as_json: bool = typer.Option(False, "--json", help="Print the report JSON."),
) -> None:
    """The comparison table: alpha x loss_stack x model, mean and 95% interval over seeds."""
    from sweeps.report.build import report_markdown

    client = _client()
    report = client.request("GET", f"/sweeps/{sweep_id}/report").json()
    if as_json:
        print(json.dumps(report, indent=2))
        return
    console.print(report_markdown(report))
    sweep = client.request("GET", f"/sweeps/{sweep_id}").json()
    if sweep["mlflow"]["ui_url"]:
        console.print(f"MLflow: {sweep['mlflow']['ui_url']}")

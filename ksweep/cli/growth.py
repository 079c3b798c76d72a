"""``ksweep extend ID``: a sweep that grows (``--validate``: its dry run), on
:class:`ksweep.Client`. Torch-free, as every REST command; ``ksweep report ID1 ID2`` (sweeps
compared) is :mod:`.client`'s report command."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from ksweep.cli.client import console, exits, open_client

if TYPE_CHECKING:
    from service.api.schemas import ExtensionPlan

SHOWN_NEW_ROWS = 40


def _values(text: str | None, kind: Callable[[str], Any], option: str) -> list[Any] | None:
    if text is None:
        return None
    try:
        values = [value for part in text.split(",") if part.strip() for value in _part(part.strip(), kind)]
    except ValueError:
        ranges = ", or ranges a-b (10-19)" if kind is int else ""
        console.print(f"[red]{option} {text!r}: give comma-separated {kind.__name__} values{ranges}[/red]")
        raise typer.Exit(2) from None
    if not values:
        console.print(f"[red]{option}: no value given[/red]")
        raise typer.Exit(2)
    return values


def _part(part: str, kind: Callable[[str], Any]) -> list[Any]:
    """One comma-separated part: a value, or for integers a range ``a-b`` (both included)."""
    first, dash, last = part.partition("-")
    if kind is int and dash and first:  # "-3" is a value; "3-5" a range
        low, high = int(first), int(last)
        if low > high:
            raise ValueError(part)
        return list(range(low, high + 1))
    return [kind(part)]


def _added_text(added: dict[str, list[Any]]) -> str:
    return "; ".join(f"{axis} {', '.join(f'{v:g}' if isinstance(v, float) else str(v) for v in values)}"
                     for axis, values in added.items()) or "nothing new"


def _mark(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def render_extension_plan(plan: ExtensionPlan, sweep_id: str) -> None:
    """The dry run: the new rows (with their trial, new or existing) and the counts."""
    rows = plan.plan.get("rows", [])
    trials = plan.plan.get("trials", [])
    new_rows = [row for row in rows if row.get("new")]
    table = Table(title=f"sweep {sweep_id} extended: its {len(new_rows)} new rows",
                  title_justify="left")
    swept = [a for a in ("beta", "free_bits", "target_rate") if any(a in row for row in rows)]
    for column in ("alpha", "loss stack", "model", *swept, "seed", "trial"):
        table.add_column(column, no_wrap=True)
    for row in new_rows[:SHOWN_NEW_ROWS]:
        trial = trials[row["trial"]] if row["trial"] < len(trials) else {}
        status = "exists" if trial.get("exists") else "new"
        table.add_row(_mark(row["alpha"]), row["loss_stack"], row["model"],
                      *(_mark(row.get(a)) for a in swept), str(row["seed"]),
                      f"{row['trial'] + 1} ({status})")
    if len(new_rows) > SHOWN_NEW_ROWS:
        table.add_row(f"... {len(new_rows) - SHOWN_NEW_ROWS} more", *[""] * (len(swept) + 4))
    console.print(table)
    console.print(f"adds {_added_text(plan.added)}: rows {plan.rows_before} -> "
                  f"{plan.rows_before + plan.rows_new} ({plan.rows_new} new); trials "
                  f"{plan.trials_existing} already run or planned, {plan.trials_new} new "
                  f"(only these run)")
    for note in plan.notes:
        console.print(f"  {note}")


def extend_command(
    sweep_id: str = typer.Argument(..., help="The sweep to extend."),
    seeds: str = typer.Option(None, help="Seeds to add, comma-separated, ranges included (3,4 or 10-19)."),
    alpha: str = typer.Option(None, help="Alpha values to add, comma-separated (0.5,4)."),
    loss_stacks: str = typer.Option(None, "--loss-stacks",
                                    help="Preset stacks to add, comma-separated (ncc)."),
    models: str = typer.Option(None, help="Latent families to add (continuous)."),
    beta: str = typer.Option(None, help="Beta values to add (a sweep that sweeps beta)."),
    free_bits: str = typer.Option(None, "--free-bits", help="Free-bits values to add."),
    primary: bool = typer.Option(False, "--primary", help="Declare the contrasts this extension "
                                 "adds primary (before they run); else they are exploratory."),
    cancelled: bool = typer.Option(False, "--cancelled", help="Extend a cancelled sweep."),
    validate: bool = typer.Option(False, "--validate", help="Dry run: show the new rows and "
                                  "which trials already exist; run and change nothing."),
    idempotency_key: str = typer.Option(None, help="Retrying with the same key is safe."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
) -> None:
    """Grow a sweep: more seeds, alphas, stacks or models. Only the new trials run, in cohorts;
    the report is rebuilt over the union under the same MLflow parent run."""
    axes = {"seeds": _values(seeds, int, "--seeds"), "alpha": _values(alpha, float, "--alpha"),
            "loss_stacks": _values(loss_stacks, str, "--loss-stacks"),
            "models": _values(models, str, "--models"), "beta": _values(beta, float, "--beta"),
            "free_bits": _values(free_bits, float, "--free-bits")}
    with exits(), open_client() as client:
        if validate:
            plan = client.validate_extension(sweep_id, **axes)
        else:
            result = client.extend(sweep_id, **axes, primary=primary, allow_cancelled=cancelled,
                                   idempotency_key=idempotency_key)
    if validate:
        if as_json:
            print(plan.model_dump_json(indent=1))
        else:
            render_extension_plan(plan, sweep_id)
        return
    if as_json:
        print(result.model_dump_json(indent=1))
        return
    record = result.extension
    console.print(f"sweep [bold]{sweep_id}[/bold]: extension {record.number} adds "
                  f"{_added_text(record.added)}; {record.trials['new']} new trial(s), "
                  f"{record.trials['after']} in all; now {result.sweep.state}")
    console.print(f"  {result.when}", soft_wrap=False)
    if record.primary:
        console.print("  its new contrasts are declared primary")
    console.print(f"  watch:  ksweep watch {sweep_id}")

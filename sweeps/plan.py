"""The plan of a sweep: what would run, and what it would cost, without running anything."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from sweeps.spec import AlphaRange, SweepSpec

__all__ = ["SweepPlan", "build_plan", "render_plan"]

SHOWN_ROWS = 50


@dataclass
class SweepPlan:
    """The expansion of a spec (``ksweep validate``, ``POST /sweeps:validate``).

    Attributes:
        trial_count: trials the sweep runs.
        rows: one dict (alpha, loss_stack, model, seed) per trial. For random and Optuna
            search the sampled axes are shown as distributions: alpha ``U[0, 4]`` or
            ``logU[0.1, 4]``, loss_stack ``choice(a|b)``.
        epochs_per_trial: the most epochs one trial runs (ASHA may stop it sooner).
        total_epochs: epochs of the whole sweep if no trial stops early (the upper bound).
        resources_per_trial: ``{"cpu": ..., "gpu": ...}`` reserved by one trial.
        max_concurrent: trials running at once at most.
        peak_resources: ``resources_per_trial`` times ``max_concurrent``.
        search, scheduler, objective: the spec's sections (scheduler.max_t resolved,
            objective.modes filled in).
        name: the sweep's name.
    """

    trial_count: int
    rows: list[dict[str, Any]]
    epochs_per_trial: int
    total_epochs: int
    resources_per_trial: dict[str, float]
    max_concurrent: int
    peak_resources: dict[str, float]
    search: dict[str, Any]
    scheduler: dict[str, Any]
    objective: dict[str, Any]
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-serialisable dicts and lists."""
        return dataclasses.asdict(self)


def _choice(options: list[str]) -> str:
    return options[0] if len(options) == 1 else f"choice({'|'.join(options)})"


def _rows(spec: SweepSpec) -> list[dict[str, Any]]:
    if spec.search.kind == "grid":
        return spec.grid_points()
    alpha = spec.alpha.describe() if isinstance(spec.alpha, AlphaRange) else str(spec.alpha)
    sampled = {
        "alpha": alpha,
        "loss_stack": _choice(spec.stack_labels()),
        "model": _choice(list(spec.models)),
    }
    if spec.search.kind == "random":
        # Each sample runs once per seed, so replicates share a configuration.
        return [
            {**sampled, "seed": seed}
            for _ in range(spec.search.num_samples)
            for seed in spec.seed_list()
        ]
    seed = spec.seed_list()[0]
    return [{**sampled, "seed": seed} for _ in range(spec.search.num_samples)]


def build_plan(spec: SweepSpec) -> SweepPlan:
    """Expand a validated spec into its plan (deterministic; samples nothing)."""
    count = spec.trial_count()
    epochs = spec.epochs_per_trial()
    per_trial = {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    concurrent = min(spec.budget.max_concurrent_trials or count, count)
    scheduler = spec.scheduler.model_dump(mode="json")
    if spec.scheduler.max_t is None:
        scheduler["max_t"] = spec.template.training.epochs
    return SweepPlan(
        trial_count=count,
        rows=_rows(spec),
        epochs_per_trial=epochs,
        total_epochs=count * epochs,
        resources_per_trial=per_trial,
        max_concurrent=concurrent,
        peak_resources={key: value * concurrent for key, value in per_trial.items()},
        search=spec.search.model_dump(mode="json"),
        scheduler=scheduler,
        objective={"metrics": list(spec.objective.metrics), "modes": spec.objective_modes()},
        name=spec.name,
    )


def _number(value: float) -> str:
    return f"{value:g}"


def render_plan(plan: SweepPlan, console: Console | None = None) -> None:
    """Print the plan: a table of the first rows, then the trial count, epochs and resources."""
    console = console or Console()
    table = Table(title=f"sweep {plan.name}" if plan.name else "sweep plan")
    for column, justify in (("#", "right"), ("alpha", "right"), ("loss stack", "left"),
                            ("model", "left"), ("seed", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for index, row in enumerate(plan.rows[:SHOWN_ROWS]):
        alpha = row["alpha"]
        table.add_row(
            str(index + 1),
            _number(alpha) if isinstance(alpha, int | float) else str(alpha),
            str(row["loss_stack"]),
            str(row["model"]),
            str(row["seed"]),
        )
    hidden = len(plan.rows) - SHOWN_ROWS
    if hidden > 0:
        table.add_row("", f"... {hidden} more", "", "", "")
    console.print(table)
    search = plan.search["kind"]
    if search == "optuna":
        search = f"optuna ({plan.search['sampler']})"
    scheduler = plan.scheduler["kind"]
    if scheduler == "asha":
        scheduler = (
            f"asha (grace {plan.scheduler['grace_period']}, max_t {plan.scheduler['max_t']}, "
            f"reduction {_number(plan.scheduler['reduction_factor'])})"
        )
    objective = ", ".join(
        f"{metric} ({mode})"
        for metric, mode in zip(plan.objective["metrics"], plan.objective["modes"], strict=True)
    )
    per, peak = plan.resources_per_trial, plan.peak_resources
    console.print(
        f"[bold]{plan.trial_count} trials[/bold]  search {search}, scheduler {scheduler}\n"
        f"objective: {objective}\n"
        f"epoch budget: at most {plan.total_epochs} epochs "
        f"({plan.trial_count} x {plan.epochs_per_trial})\n"
        f"resources: {_number(per['cpu'])} cpu, {_number(per['gpu'])} gpu per trial; "
        f"{plan.max_concurrent} at once: peak {_number(peak['cpu'])} cpu, "
        f"{_number(peak['gpu'])} gpu"
    )

"""The plan of a sweep: what would run, and what it would cost, without running anything.

This is the one place the axes are expanded. The requested rows are every point of
alpha x loss stack x model x beta x free bits x seed; rows whose objective is identical
(:func:`sweeps.plan.equivalence.objective_signature`) for the same model and seed run as one
trial, which stands in every row it belongs to. ``SweepSpec.trial_count``, the runner's
Tune search space and the report all read this plan.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sweeps.plan.equivalence import objective_signature
from sweeps.plan.units import annotate_trials, default_facts, schedule_warnings
from sweeps.spec import SweepSpec, ValueRange
from workers.cohort.grouping import group_cohorts
from workers.datasets.train_facts import TrainFacts

if TYPE_CHECKING:  # numpy (random search) and rich (render_plan) load where used: the API
    import numpy as np  # imports this module for SweepPlan
    from rich.console import Console

__all__ = ["SEARCH_AXES", "SweepPlan", "build_plan", "cohort_size_for", "render_plan", "row_label",
           "subplan", "trial_key"]

# The search axes of a sweep, in this order: every trial's params (beta and free bits only
# when the sweep sweeps them), its progress record's config and its report row.
SEARCH_AXES: tuple[str, ...] = ("alpha", "loss_stack", "model", "seed", "beta", "free_bits")
SHOWN_ROWS = 50
SHOWN_COHORTS = 20
AUTO_COHORT_MAX = 32
AUTO_WORKERS = 4
"""``cohort_size: auto`` = ceil(trials / workers) capped at AUTO_COHORT_MAX, where workers is
budget.max_concurrent_trials, else AUTO_WORKERS (the plan must not depend on the machine)."""


def row_label(row: dict[str, Any]) -> str:
    """A requested row as the ``ksweep.shared_by`` tag lists it: ``uniform@alpha=1``."""
    return f"{row['loss_stack']}@alpha={float(row['alpha']):g}"


def trial_key(params: dict[str, Any]) -> tuple:
    """The identity of a trial from its params (Tune config or MLflow params)."""
    def number(value: Any) -> float | None:
        return None if value in (None, "", "None") else float(value)

    return (number(params["alpha"]), str(params["loss_stack"]), str(params["model"]),
            int(params["seed"]), number(params.get("beta")), number(params.get("free_bits")))


@dataclass
class SweepPlan:
    """The expansion of a spec (``ksweep validate``, ``POST /sweeps:validate``).

    Attributes:
        trial_count: trials the sweep runs (= trials_after_dedup).
        trials_requested: rows of the full grid (for random/optuna: the samples).
        trials_after_dedup: trials left once objective-identical rows share one trial.
        trials_saved_by_dedup: trials_requested - trials_after_dedup.
        rows: one dict per requested row (alpha, loss_stack, model, seed, plus beta and
            free_bits when swept) with ``trial``, the index of the trial that runs it, and
            ``shared`` (whether that trial stands in other rows too). Random search's rows
            are the drawn points (one row per sample and seed); for Optuna the sampled axes
            are shown as distributions (``U[0, 4]``, ``logU[0.1, 4]``, ``choice(a|b)``).
            Nothing is shared in either.
        trials: the trials that run: their params and ``shared_by``, the row labels
            (``stack@alpha=a``) each stands for when it stands for more than one; their
            ``total_steps`` (optimizer steps of the whole run), ``elbo_beta`` (beta in ELBO
            units, as text: known, ``N x c_base`` or ``unknown (why)``) and
            ``schedule_overruns`` (:mod:`sweeps.plan.units`).
        train: the train split as known before the run: ``rows``, ``mean_target_length``
            (None when not known) and ``source`` (where they come from, or why unknown).
        warnings: what the plan runs that cannot do what it says (a schedule that does not
            finish within its trial's run), one line each.
        cohort_size: the resolved ``resources.cohort_size`` (``auto`` made a number).
        cohorts: the trials (indices into ``trials``) each worker trains together, one Tune
            trial per cohort (:func:`workers.cohort.grouping.group_cohorts`: members share every
            shape); ``[[0], [1], ...]`` at cohort size 1.
        epochs_per_trial: the most epochs one trial runs (ASHA may stop it sooner).
        total_epochs: epochs of the whole sweep if no trial stops early (the upper bound).
        resources_per_trial: ``{"cpu": ..., "gpu": ...}`` reserved by one Tune trial (a
            whole cohort when cohort_size > 1).
        max_concurrent: Tune trials (cohorts) running at once at most.
        peak_resources: ``resources_per_trial`` times ``max_concurrent``.
        search, scheduler, objective: the spec's sections (scheduler.max_t resolved,
            objective.modes filled in).
        name: the sweep's name.
        power: with a pilot sweep (``ksweep validate --pilot``, ``POST /sweeps:validate?pilot=``):
            the planned primary family's power from the pilot's paired SDs
            (:func:`sweeps.report.power_plan.pilot_power`); None otherwise.
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
    trials_requested: int = 0
    trials_after_dedup: int = 0
    trials_saved_by_dedup: int = 0
    trials: list[dict[str, Any]] = field(default_factory=list)
    cohort_size: int = 1
    cohorts: list[list[int]] = field(default_factory=list)
    train: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    power: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-serialisable dicts and lists."""
        return dataclasses.asdict(self)

    def rows_of_trial(self) -> dict[tuple, list[dict[str, Any]]]:
        """trial_key of each trial that runs -> the requested rows it stands in."""
        by_index: dict[int, list[dict[str, Any]]] = {}
        for row in self.rows:
            by_index.setdefault(row["trial"], []).append(row)
        return {trial_key(trial): by_index.get(index, []) for index, trial in enumerate(self.trials)}


def _choice(options: list[str]) -> str:
    return options[0] if len(options) == 1 else f"choice({'|'.join(options)})"


def _grid_rows(spec: SweepSpec) -> list[dict[str, Any]]:
    rows = []
    for model, stack, alpha, beta, free_bits, seed in itertools.product(
        spec.models, spec.stack_labels(), spec.alpha_values(), spec.beta_values(),
        spec.free_bits_values(), spec.seed_list(),
    ):
        row: dict[str, Any] = {"alpha": float(alpha), "loss_stack": stack, "model": model,
                               "seed": seed}
        if beta is not None:
            row["beta"] = float(beta)
        if free_bits is not None:
            row["free_bits"] = float(free_bits)
        rows.append(row)
    return rows


def _dedup(spec: SweepSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every row its ``trial``; return the trials (first row of each objective)."""
    trials: list[dict[str, Any]] = []
    index_of: dict[tuple, int] = {}
    signatures: dict[tuple, str] = {}
    for row in rows:
        point = (row["loss_stack"], row["alpha"], row.get("beta"), row.get("free_bits"))
        if point not in signatures:
            signatures[point] = objective_signature(
                spec.stack_spec(row["loss_stack"], row["alpha"], row.get("beta"),
                                row.get("free_bits")))
        key = (signatures[point], row["model"], row["seed"])
        if key not in index_of:
            index_of[key] = len(trials)
            trials.append({**row, "shared_by": []})
        row["trial"] = index_of[key]
        trials[row["trial"]]["shared_by"].append(row_label(row))
    for row in rows:
        row["shared"] = len(trials[row["trial"]]["shared_by"]) > 1
    for trial in trials:
        if len(trial["shared_by"]) == 1:
            trial["shared_by"] = []
    return trials


def _one_trial_per_row(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row its own trial (sampled searches, and grids with ``search.dedup: false``)."""
    for index, row in enumerate(rows):
        row.update(trial=index, shared=False)
    return [{k: v for k, v in row.items() if k not in ("trial", "shared")} | {"shared_by": []}
            for row in rows]


def _describe(value: Any) -> str:
    return value.describe() if isinstance(value, ValueRange) else str(value)


def _distribution_rows(spec: SweepSpec) -> list[dict[str, Any]]:
    """Optuna: the axes as distributions (its sampler proposes the points while it runs)."""
    sampled: dict[str, Any] = {
        "alpha": _describe(spec.alpha),
        "loss_stack": _choice(spec.stack_labels()),
        "model": _choice(list(spec.models)),
    }
    for axis in ("beta", "free_bits"):
        if getattr(spec, axis) is not None:
            sampled[axis] = _describe(getattr(spec, axis))
    # One configuration per trial: the spec's single seed.
    return [{**sampled, "seed": spec.seed_list()[0]} for _ in range(spec.search.num_samples)]


def _draw(rng: np.random.Generator, value: ValueRange) -> float:
    """One draw from a range: uniform, or log-uniform with ``log``."""
    if value.log:
        return float(math.exp(rng.uniform(math.log(value.low), math.log(value.high))))
    return float(rng.uniform(value.low, value.high))


def _random_rows(spec: SweepSpec) -> list[dict[str, Any]]:
    """Random search: ``num_samples`` points drawn here, seeded by ``search.seed`` (the same
    spec always gives the same rows), each run once per seed."""
    import numpy as np

    rng = np.random.default_rng(spec.search.seed)
    stacks, models = spec.stack_labels(), list(spec.models)
    rows = []
    for _ in range(spec.search.num_samples):
        point: dict[str, Any] = {"alpha": _draw(rng, spec.alpha),
                                 "loss_stack": stacks[int(rng.integers(len(stacks)))],
                                 "model": models[int(rng.integers(len(models)))]}
        for axis in ("beta", "free_bits"):
            if getattr(spec, axis) is not None:
                point[axis] = _draw(rng, getattr(spec, axis))
        rows += [{**point, "seed": seed} for seed in spec.seed_list()]
    return rows


def cohort_size_for(spec: SweepSpec, trial_count: int) -> int:
    """``resources.cohort_size`` as a number (see :data:`AUTO_WORKERS` for ``auto``)."""
    size = spec.resources.cohort_size
    if size != "auto":
        return int(size)
    if spec.search.kind == "optuna" or spec.scheduler.kind == "asha":
        return 1  # these decide trial by trial (docs/performance.md, "Cohorts")
    workers = spec.budget.max_concurrent_trials or AUTO_WORKERS
    return max(1, min(AUTO_COHORT_MAX, math.ceil(trial_count / workers)))


def _cohorts(spec: SweepSpec, trials: list[dict[str, Any]], size: int) -> list[list[int]]:
    if size == 1:
        return [[index] for index in range(len(trials))]
    return group_cohorts([spec.trial_config_for(trial) for trial in trials], size)


def build_plan(spec: SweepSpec, facts: TrainFacts | None = None) -> SweepPlan:
    """Expand a validated spec into its plan (deterministic: random search's points are
    drawn from ``search.seed``; Optuna's are left to its sampler). ``facts``: the train split
    as the caller can read it (a dataset's store); default what the spec carries
    (:func:`sweeps.plan.units.default_facts`)."""
    if spec.search.kind == "grid":
        rows = _grid_rows(spec)
        trials = _dedup(spec, rows) if spec.search.dedup else _one_trial_per_row(rows)
    elif spec.search.kind == "random":
        rows = _random_rows(spec)
        trials = _one_trial_per_row(rows)
    else:
        rows = _distribution_rows(spec)
        trials = _one_trial_per_row(rows)
    facts = facts or default_facts(spec)
    annotate_trials(spec, trials, facts)
    count = len(trials)
    size = cohort_size_for(spec, count)
    cohorts = _cohorts(spec, trials, size)
    epochs = spec.epochs_per_trial()
    per_trial = {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    concurrent = min(spec.budget.max_concurrent_trials or len(cohorts), len(cohorts))
    scheduler = spec.scheduler.model_dump(mode="json")
    if spec.scheduler.max_t is None:
        scheduler["max_t"] = spec.template.training.epochs
    return SweepPlan(
        trial_count=count,
        rows=rows,
        epochs_per_trial=epochs,
        total_epochs=count * epochs,
        resources_per_trial=per_trial,
        max_concurrent=concurrent,
        peak_resources={key: value * concurrent for key, value in per_trial.items()},
        search=spec.search.model_dump(mode="json"),
        scheduler=scheduler,
        objective={"metrics": list(spec.objective.metrics), "modes": spec.objective_modes()},
        name=spec.name,
        trials_requested=len(rows),
        trials_after_dedup=count,
        trials_saved_by_dedup=len(rows) - count,
        trials=trials,
        cohort_size=size,
        cohorts=cohorts,
        train=facts.to_dict(),
        warnings=schedule_warnings(trials),
    )


def subplan(spec: SweepSpec, plan: SweepPlan, trials: list[dict[str, Any]]) -> SweepPlan:
    """``plan`` narrowed to ``trials`` (one segment of a grown sweep: the trials it trains),
    regrouped into cohorts as a plan of those trials alone would be. Its ``rows`` stay the
    whole plan's (their ``trial`` indices point into ``plan.trials``)."""
    size = cohort_size_for(spec, len(trials))
    cohorts = _cohorts(spec, trials, size) if trials else []
    concurrent = min(spec.budget.max_concurrent_trials or len(cohorts), len(cohorts))
    return dataclasses.replace(
        plan, trial_count=len(trials), trials=list(trials), cohort_size=size, cohorts=cohorts,
        total_epochs=len(trials) * plan.epochs_per_trial, max_concurrent=concurrent,
        peak_resources={key: value * concurrent for key, value in plan.resources_per_trial.items()})


def _number(value: float) -> str:
    return f"{value:g}"


def render_plan(plan: SweepPlan, console: Console | None = None) -> None:
    """Print the plan: a table of the first rows, then the trial count, epochs and resources."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"sweep {plan.name}" if plan.name else "sweep plan")
    swept = [axis for axis in ("beta", "free_bits") if any(axis in row for row in plan.rows)]
    columns = ["alpha", "loss_stack", "model", *swept, "seed"]
    cohort_of = {trial: number for number, members in enumerate(plan.cohorts, 1) for trial in members}
    extra = ["trial", "cohort"] if plan.cohort_size > 1 else ["trial"]
    units = ["steps", "beta (ELBO)"]
    for column in ("#", *columns, *units, *extra):
        table.add_column(column, justify="left" if column in ("loss_stack", "model") else "right")
    for index, row in enumerate(plan.rows[:SHOWN_ROWS]):
        values = [_number(row[c]) if isinstance(row[c], float) else str(row[c]) for c in columns]
        ran = plan.trials[row["trial"]] if row["trial"] < len(plan.trials) else {}
        steps = "?" if ran.get("total_steps") is None else str(ran["total_steps"])
        if ran.get("schedule_overruns"):
            steps += " !"
        trial = f"{row['trial'] + 1}" + (" (shared)" if row["shared"] else "")
        cohort = [str(cohort_of.get(row["trial"], ""))] if plan.cohort_size > 1 else []
        table.add_row(str(index + 1), *values, steps, str(ran.get("elbo_beta", "")), trial, *cohort)
    hidden = len(plan.rows) - SHOWN_ROWS
    if hidden > 0:
        table.add_row("", f"... {hidden} more", *[""] * (len(columns) + len(units) + len(extra) - 1))
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
        f"[bold]{plan.trial_count} trials[/bold] ({plan.trials_requested} requested, "
        f"{plan.trials_saved_by_dedup} saved by dedup: objective-identical rows share a trial)  "
        f"search {search}, scheduler {scheduler}\n"
        f"objective: {objective}\n"
        f"epoch budget: at most {plan.total_epochs} epochs "
        f"({plan.trial_count} x {plan.epochs_per_trial})\n"
        f"resources: {_number(per['cpu'])} cpu, {_number(per['gpu'])} gpu per "
        f"{'cohort' if plan.cohort_size > 1 else 'trial'}; "
        f"{plan.max_concurrent} at once: peak {_number(peak['cpu'])} cpu, "
        f"{_number(peak['gpu'])} gpu"
    )
    console.print(cohort_summary(plan))
    console.print(units_summary(plan))
    for line in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {line}")


def units_summary(plan: SweepPlan) -> str:
    """The train split the steps and ELBO units are read from, and what the two columns mean."""
    train = plan.train or {}
    rows = "? rows" if train.get("rows") is None else f"{train['rows']} rows"
    length = train.get("mean_target_length")
    mean = "mean target length ?" if length is None else f"mean target length {length:.4g}"
    return (f"train split: {rows}, {mean} ({train.get('source', 'not known')})\n"
            "steps: each trial's optimizer steps (epochs x ceil(train rows / batch_size)); ! a "
            "schedule does not finish within them. beta (ELBO): beta in ELBO units, beta x the mean target "
            "length under the per-example KL (x c_base for stacks divided by it), beta under "
            "the per-token KL (docs/concepts/objectives.md, KL units)")


def cohort_summary(plan: SweepPlan) -> str:
    """The plan's cohorts in words: how many, their sizes, which trials (1-based) each trains."""
    sizes = [len(members) for members in plan.cohorts]
    if plan.cohort_size == 1:
        return f"cohorts: off (cohort size 1): {len(sizes)} Tune trials of one trial each"
    lines = [f"cohorts: {len(sizes)} (cohort size {plan.cohort_size}; sizes "
             f"{', '.join(str(n) for n in sizes)}), one worker (Tune trial) each"]
    for number, members in enumerate(plan.cohorts[:SHOWN_COHORTS], 1):
        lines.append(f"  cohort {number}: trials {', '.join(str(t + 1) for t in members)}")
    if len(plan.cohorts) > SHOWN_COHORTS:
        lines.append(f"  ... {len(plan.cohorts) - SHOWN_COHORTS} more")
    return "\n".join(lines)

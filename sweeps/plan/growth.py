"""A sweep that grows: an extension's values joined to the spec's axes, and what it adds.

An extension names values to add to the swept axes (``seeds``, ``alpha``, ``loss_stacks``,
``models``, ``beta``, ``free_bits``); the axes become the Cartesian product of the unions,
the old values first, so the trials that already ran keep their rows. Everything else in the
spec is fixed: a value that would change a non-swept setting is refused naming its field, as
are Optuna and ASHA sweeps (their searches decide trial by trial), any axis but ``seeds`` on a
random sweep, and an extension that adds nothing. :func:`extension_plan` says which rows are
new and which trials already exist (matched by :func:`~sweeps.plan.identity.objective_key`,
so a new alpha adds no ``uniform`` trial). Torch-free: the API and the CLI call it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from objectives.field_errors import LocatedProblem, located_errors
from objectives.spec import LossStackSpec
from sweeps.plan.budget import build_plan_within_budget
from sweeps.plan.build import SweepPlan, build_plan
from sweeps.plan.identity import objective_key
from sweeps.spec import SweepSpec

__all__ = ["GROWABLE_AXES", "ExtensionRequest", "MarkedPlan", "added_values", "extend_spec",
           "extension_plan"]

GROWABLE_AXES: tuple[str, ...] = ("seeds", "alpha", "loss_stacks", "models", "beta", "free_bits")
"""The spec fields an extension may add values to (every other field is fixed)."""
_OPTIONS = ("primary", "allow_cancelled")
_ROW_AXES = ("alpha", "loss_stack", "model", "seed", "beta", "free_bits", "target_rate")


def _stack_kind(value: Any) -> str:
    return "preset" if isinstance(value, str) else "inline"


Values = Annotated[list[Annotated[float, Field(ge=0, allow_inf_nan=False)]],
                   Field(min_length=1, max_length=64)]


class ExtensionRequest(BaseModel):
    """The values an extension adds, and how its new contrasts count (``POST .../extend``).

    Fields other than these are refused by name unless they equal the sweep's own value.
    """

    model_config = ConfigDict(extra="allow")

    seeds: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | None = Field(
        None, min_length=1, max_length=100, description="Seeds to add (values, not a count).")
    alpha: Values | None = Field(None, description="Alpha values to add (grid sweeps).")
    loss_stacks: list[Annotated[
        Annotated[str, Tag("preset")] | Annotated[LossStackSpec, Tag("inline")],
        Discriminator(_stack_kind)]] | None = Field(
        None, min_length=1, max_length=16,
        description="Loss stacks to add: preset names or inline stacks with a name.")
    models: list[Literal["discrete", "continuous"]] | None = Field(
        None, min_length=1, max_length=2, description="Latent families to add.")
    beta: Values | None = Field(None, description="Beta values to add (a sweep that sweeps beta).")
    free_bits: Values | None = Field(
        None, description="Free-bits values to add (a sweep that sweeps free bits).")
    primary: bool = Field(
        False, description="Declare the contrasts this extension adds (at new alphas, stacks, "
        "models, betas) primary before they run: they join the primary family and its Holm "
        "adjustment. Unset: they are exploratory.")
    allow_cancelled: bool = Field(
        False, description="Extend a cancelled sweep (refused unless asked for).")


def _differences(given: Any, current: Any, path: tuple[str | int, ...]) -> Iterator[tuple]:
    """Paths where ``given`` (part of a spec) differs from ``current`` (the sweep's)."""
    if isinstance(given, dict) and isinstance(current, dict):
        for key, value in given.items():
            yield from _differences(value, current.get(key), (*path, key))
    elif given != current:
        yield path, current


def _stack_text(stack: str | LossStackSpec) -> Any:
    return stack if isinstance(stack, str) else stack.model_dump(
        mode="json", exclude={"alpha", "c_base"})


def _label(stack: str | LossStackSpec) -> str:
    return stack if isinstance(stack, str) else str(stack.name)


def _fixed_field_problems(spec: SweepSpec, request: ExtensionRequest) -> list[LocatedProblem]:
    problems: list[LocatedProblem] = []
    current = spec.model_dump(mode="json")
    for key, value in (request.model_extra or {}).items():
        if key not in SweepSpec.model_fields:
            problems.append(((key,), f"unknown field; an extension takes "
                                     f"{', '.join((*GROWABLE_AXES, *_OPTIONS))}"))
            continue
        for path, was in _differences(value, current.get(key), (key,)):
            shown = ".".join(str(p) for p in path)
            problems.append((path, f"{shown} is not swept (the sweep has {was!r}); an extension "
                                   "adds values to the swept axes only: submit a new sweep for "
                                   "another setting"))
    return problems


def _search_problems(spec: SweepSpec, request: ExtensionRequest) -> list[LocatedProblem]:
    if spec.search.kind == "optuna":
        return [(("search", "kind"), "an Optuna sweep cannot be extended: its sampler chose "
                                     "each trial from the ones before; submit a new sweep")]
    if spec.scheduler.kind == "asha":
        return [(("scheduler", "kind"), "an ASHA sweep cannot be extended: its rungs compared "
                                        "the trials that ran together; submit a new sweep")]
    if spec.search.kind == "random":
        return [((axis,), f"a random sweep takes seeds only (its points are drawn from "
                          f"search.seed); {axis} cannot be added")
                for axis in GROWABLE_AXES if axis != "seeds" and getattr(request, axis)]
    return []


def _unswept_problems(spec: SweepSpec, request: ExtensionRequest) -> list[LocatedProblem]:
    return [((axis,), f"the sweep does not sweep {axis} (each stack keeps its own kl value); "
                      f"adding {axis} values would change a non-swept setting")
            for axis in ("beta", "free_bits") if getattr(request, axis) and getattr(spec, axis) is None]


def _union(old: Sequence[Any], new: Sequence[Any] | None) -> list[Any]:
    return list(old) + [value for value in dict.fromkeys(new or ()) if value not in old]


def _stack_union(spec: SweepSpec, added: Sequence[str | LossStackSpec] | None,
                 problems: list[LocatedProblem]) -> list[Any]:
    stacks = [_stack_text(stack) for stack in spec.loss_stacks]
    labels = spec.stack_labels()
    for index, stack in enumerate(added or ()):
        label, text = _label(stack), _stack_text(stack)
        if label not in labels:
            stacks.append(text)
            labels.append(label)
        elif stacks[labels.index(label)] != text:
            problems.append((("loss_stacks", index), f"the sweep has a loss stack labelled "
                             f"{label!r} with another definition; give the new stack its own name"))
    return stacks


def extend_spec(spec: SweepSpec, request: ExtensionRequest) -> SweepSpec:
    """The spec with the extension's values joined to its axes (old values first).

    Raises:
        pydantic.ValidationError: every refusal, located at its field (``search.kind``,
            ``alpha``, ``template.training.epochs``, ``loss_stacks.0``...); or the joined spec
            is invalid (located as a spec's own errors are).
    """
    problems = [*_search_problems(spec, request), *_fixed_field_problems(spec, request),
                *_unswept_problems(spec, request)]
    data = spec.model_dump(mode="json")
    data["seeds"] = _union(spec.seed_list(), request.seeds)
    data["models"] = _union(spec.models, request.models)
    for axis in ("alpha", "beta", "free_bits"):
        if isinstance(data[axis], list):
            data[axis] = _union(data[axis], [float(v) for v in getattr(request, axis) or ()])
    data["loss_stacks"] = _stack_union(spec, request.loss_stacks, problems)
    if not problems and not added_values(spec, data):
        problems.append(((), "the extension adds no new value to seeds, alpha, loss_stacks, "
                             "models, beta or free_bits"))
    if problems:
        raise located_errors("SweepExtension", problems)
    return SweepSpec.model_validate(data)


def added_values(spec: SweepSpec, extended: SweepSpec | dict[str, Any]) -> dict[str, list[Any]]:
    """Per axis, the values ``extended`` has that ``spec`` has not (stacks by label)."""
    after = extended if isinstance(extended, dict) else extended.model_dump(mode="json")
    before = spec.model_dump(mode="json")
    seeds_before = spec.seed_list()
    seeds_after = list(range(after["seeds"])) if isinstance(after["seeds"], int) else after["seeds"]
    added: dict[str, list[Any]] = {}
    if new := [s for s in seeds_after if s not in seeds_before]:
        added["seeds"] = new
    for axis in ("alpha", "models", "beta", "free_bits"):
        new = [v for v in after[axis] if v not in (before[axis] or [])] \
            if isinstance(after[axis], list) else []
        if new:
            added[axis] = new
    labels = spec.stack_labels()
    if new := [_label(s) if isinstance(s, str) else s["name"] for s in after["loss_stacks"]
               if (s if isinstance(s, str) else s["name"]) not in labels]:
        added["loss_stacks"] = new
    return added


@dataclass
class MarkedPlan:
    """The extended sweep's plan, with its rows and trials marked new or existing.

    ``plan.rows`` carry ``new`` (a row the sweep did not have); ``plan.trials`` carry
    ``exists`` (the sweep already has a trial of that objective, model and seed: it does not
    run again).
    """

    plan: SweepPlan
    added: dict[str, list[Any]]
    rows_before: int
    rows_new: int
    trials_before: int
    trials_existing: int
    trials_new: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"added": self.added, "rows_before": self.rows_before, "rows_new": self.rows_new,
                "trials_before": self.trials_before, "trials_existing": self.trials_existing,
                "trials_new": self.trials_new, "notes": self.notes, "plan": self.plan.to_dict()}


def _row_point(row: dict[str, Any]) -> tuple:
    return tuple(row.get(axis) for axis in _ROW_AXES)


def extension_plan(spec: SweepSpec, extended: SweepSpec) -> MarkedPlan:
    """What extending ``spec`` to ``extended`` adds (the union's plan, marked).

    Raises:
        pydantic.ValidationError: the union is over ``budget.max_trials`` (located there).
    """
    before = build_plan(spec)
    plan = build_plan_within_budget(extended)
    old_rows = {_row_point(row) for row in before.rows}
    old_trials = {objective_key(spec, trial) for trial in before.trials}
    for row in plan.rows:
        row["new"] = _row_point(row) not in old_rows
    for trial in plan.trials:
        trial["exists"] = objective_key(extended, trial) in old_trials
    existing = sum(trial["exists"] for trial in plan.trials)
    rows_new = sum(row["new"] for row in plan.rows)
    notes = []
    shared = sum(row["new"] and plan.trials[row["trial"]]["exists"] for row in plan.rows)
    if shared:
        notes.append(f"{shared} new row(s) are objectives the sweep already trains (dedup: e.g. "
                     "uniform at a new alpha): they add no trial")
    return MarkedPlan(plan=plan, added=added_values(spec, extended), rows_before=len(before.rows),
                         rows_new=rows_new, trials_before=before.trial_count,
                         trials_existing=existing, trials_new=len(plan.trials) - existing,
                         notes=notes)

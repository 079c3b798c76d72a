"""One report over several sweeps whose rows are compatible (``ksweep report ID1 ID2``).

Sweeps are compatible when their specs agree on everything but the swept axes (``alpha``,
``loss_stacks``, ``models``, ``seeds``, ``beta``, ``free_bits``) and the bookkeeping that does
not change a trial (name, description, tags, reuse, budget, resources, tracking): the same
template, common terms, search kind and dedup, scheduler, objective and analysis; a stack
label means one stack in all of them. Anything else is refused with every differing field
named and its value in each sweep. The joined spec takes the union of each axis, and the
report is built by the one report builder from every sweep's trials, so a contrast between a
stack of one sweep and the baseline of another pairs by seed over the seeds both ran.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sweeps.plan.build import build_plan
from sweeps.plan.identity import objective_key
from sweeps.report.build import build_report, extendable
from sweeps.report.power import power_section
from sweeps.report.readout_table import TrialOutcome
from sweeps.spec import SweepSpec

__all__ = ["COMPARED_AXES", "IncompatibleSweeps", "compare_report", "joined_spec",
           "outcomes_of"]

COMPARED_AXES = ("alpha", "loss_stacks", "models", "seeds", "beta", "free_bits")
# Fields that do not change what a trial computes (or that the joined spec sets itself).
_BOOKKEEPING = ("name", "description", "tags", "reuse", "budget", "resources", "tracking")
_SEARCH_KEPT = ("kind", "dedup")  # random/optuna draws (num_samples, seed) do not apply to grids


class IncompatibleSweeps(ValueError):
    """The sweeps cannot share one report; ``problems`` are ``(field, message)`` pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in problems))
        self.problems = problems


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, (*path, str(key)))
    else:
        yield ".".join(path), value


def _fixed_part(spec: SweepSpec) -> dict[str, Any]:
    data = spec.model_dump(mode="json")
    for key in (*COMPARED_AXES, *_BOOKKEEPING):
        data.pop(key, None)
    data["search"] = {key: data["search"][key] for key in _SEARCH_KEPT}
    return data


def _stack_definitions(specs: Mapping[str, SweepSpec]) -> tuple[list[Any], list[tuple[str, str]]]:
    stacks: dict[str, Any] = {}
    owners: dict[str, str] = {}
    problems = []
    for sweep_id, spec in specs.items():
        for label, stack in zip(spec.stack_labels(), spec.model_dump(mode="json")["loss_stacks"],
                                strict=True):
            if label not in stacks:
                stacks[label], owners[label] = stack, sweep_id
            elif stacks[label] != stack:
                problems.append((f"loss_stacks.{label}", f"defined differently in "
                                 f"{owners[label]} and {sweep_id}; rename one of them"))
    return list(stacks.values()), problems


def joined_spec(specs: Mapping[str, SweepSpec]) -> SweepSpec:
    """The spec whose axes are the unions of ``specs``' (sweep id -> spec, in report order).

    Raises:
        IncompatibleSweeps: every differing field, with its value in each sweep.
    """
    fixed = {sweep_id: dict(_leaves(_fixed_part(spec))) for sweep_id, spec in specs.items()}
    problems: list[tuple[str, str]] = []
    fields = sorted({name for leaves in fixed.values() for name in leaves})
    for name in fields:
        values = {sweep_id: leaves.get(name) for sweep_id, leaves in fixed.items()}
        if len({repr(v) for v in values.values()}) > 1:
            problems.append((name, ", ".join(f"{v!r} in {s}" for s, v in values.items())))
    kinds = {spec.search.kind for spec in specs.values()}
    if kinds != {"grid"} and not any(field == "search.kind" for field, _ in problems):
        problems.append(("search.kind", f"{', '.join(sorted(kinds))}: only grid sweeps are "
                                        "compared (their rows are points of one grid)"))
    for axis in ("beta", "free_bits"):
        swept = {sweep_id: getattr(spec, axis) is not None for sweep_id, spec in specs.items()}
        if len(set(swept.values())) > 1:
            problems.append((axis, "swept in " + ", ".join(s for s, v in swept.items() if v)
                             + " only; each stack's own value elsewhere"))
    stacks, stack_problems = _stack_definitions(specs)
    problems += stack_problems
    if problems:
        raise IncompatibleSweeps(problems)
    first = next(iter(specs.values()))
    data = first.model_dump(mode="json")
    data["loss_stacks"] = stacks
    data["name"] = "compare"
    data["budget"]["max_trials"] = 10_000
    data["seeds"] = _union(spec.seed_list() for spec in specs.values())
    data["models"] = _union(spec.models for spec in specs.values())
    for axis in ("alpha", "beta", "free_bits"):
        if data[axis] is not None:
            data[axis] = _union(getattr(spec, axis) for spec in specs.values())
    return SweepSpec.model_validate(data)


def _union(lists: Iterator[Sequence[Any]] | Any) -> list[Any]:
    return list(dict.fromkeys(value for values in lists for value in values))


def outcomes_of(report: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> list[TrialOutcome]:
    """A sweep's trials as outcomes: its report's trials with their runs' final metrics
    (``runs``: ``trial_id``, ``run_id``, ``final``, ``c_base``, as :mod:`workers.tracking.reads`
    reads them)."""
    by_trial = {run["trial_id"]: run for run in runs}
    outcomes = []
    for trial in report["trials"]:
        run = by_trial.get(trial["trial_id"], {})
        final = {k: v for k, v in (run.get("final") or {}).items() if v is not None}
        if run.get("c_base") is not None:
            final.setdefault("c_base", run["c_base"])
        params = {k: v for k, v in trial.items() if k in
                  ("alpha", "loss_stack", "model", "seed", "beta", "free_bits")}
        outcomes.append(TrialOutcome(
            trial_id=trial["trial_id"], params=params, state=trial["state"], final=final,
            history={}, epochs=trial["epochs"], error=trial.get("error"),
            run_id=trial.get("mlflow_run_id"), trial_hash=trial.get("trial_hash"),
            reused_from=trial.get("reused_from")))
    return outcomes


def _across(specs: Mapping[str, SweepSpec], outcomes: Mapping[str, list[TrialOutcome]],
            names: Mapping[str, str]) -> dict[str, Any]:
    """The caveat interaction across two sweeps, each sweep's report built from its trials."""
    from sweeps.report.across import ACROSS_DIFFERENCES, across_report

    try:
        joined_spec(specs)
    except IncompatibleSweeps as error:
        problems = [(field, message) for field, message in error.problems
                    if not field.startswith(ACROSS_DIFFERENCES)]
        if problems:
            raise IncompatibleSweeps(problems) from None
    reports = []
    for sweep_id, spec in specs.items():
        report = build_report(spec, sweep_id, outcomes[sweep_id], build_plan(spec))
        report["name"] = names[sweep_id]
        reports.append(report)
    return across_report(reports, {sweep_id: spec.seed_list() for sweep_id, spec in specs.items()},
                         all(extendable(spec) for spec in specs.values()))


def compare_report(specs: Mapping[str, SweepSpec], outcomes: Mapping[str, list[TrialOutcome]],
                   names: Mapping[str, str]) -> dict[str, Any]:
    """The joined report. A trial of the same objective, model and seed in several sweeps
    is read from the first sweep that has it (in the order given).

    Two sweeps that both declare ``analysis.primary: caveat_across`` are compared across
    instead (:mod:`sweeps.report.across`): their data and declared contrasts may differ.

    Raises:
        IncompatibleSweeps: see :func:`joined_spec`.
    """
    if len(specs) == 2 and all(s.analysis.primary == "caveat_across" for s in specs.values()):
        return _across(specs, outcomes, names)
    spec = joined_spec(specs)
    seen: dict[tuple, str] = {}
    joined: list[TrialOutcome] = []
    duplicates = 0
    for sweep_id, items in outcomes.items():
        for outcome in items:
            key = objective_key(spec, outcome.params)
            if key in seen:
                duplicates += 1
                continue
            seen[key] = sweep_id
            joined.append(outcome)
    sweep_of = {outcome.trial_id: seen[objective_key(spec, outcome.params)] for outcome in joined}
    plan = build_plan(spec)
    report = build_report(spec, "+".join(specs), joined, plan)
    missing = plan.trial_count - len({objective_key(spec, t) for t in plan.trials} & set(seen))
    report["dedup"]["trials_run"] = len(joined)
    report["name"] = " + ".join(names[s] for s in specs)
    report["compared"] = [{"sweep_id": sweep_id, "name": names[sweep_id],
                           "seeds": specs[sweep_id].seed_list(),
                           "loss_stacks": specs[sweep_id].stack_labels(),
                           "alpha": specs[sweep_id].alpha_values(),
                           "trials": len(outcomes[sweep_id])} for sweep_id in specs]
    for trial in report["trials"]:
        trial["sweep_id"] = sweep_of.get(trial["trial_id"])
    # The seeds to add go to every sweep compared (each pairs by seed with the others).
    report["power"] = power_section(report["contrasts"], spec.analysis.resolved_min_effect(),
                                    {sweep_id: specs[sweep_id].seed_list() for sweep_id in specs},
                                    all(extendable(s) for s in specs.values()))
    words = [f"One report over {len(specs)} sweeps ({', '.join(specs)}): contrasts pair by seed "
             "over the seeds both sides ran; a pair's stack and baseline may come from "
             "different sweeps (the same template, so the same trial protocol)."]
    if missing:
        words.append(f"{missing} trial(s) of the joined grid ran in no sweep: their rows have no "
                     "values (see n), and contrasts pair only the seeds both sides ran.")
    if duplicates:
        words.append(f"{duplicates} trial(s) ran in more than one sweep: each is read from the "
                     "first sweep listed that has it.")
    report["limitations"] = words + report["limitations"]
    return report

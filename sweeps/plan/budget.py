"""The trial budget, checked on the plan (not inside the spec's validator, so a spec parses
without expanding its axes, and whoever needs the plan builds it once)."""

from __future__ import annotations

from objectives.field_errors import LocatedProblem, located_errors
from sweeps.plan.build import SweepPlan, build_plan
from sweeps.spec import SweepSpec
from workers.datasets.train_facts import TrainFacts

__all__ = ["budget_problems", "build_plan_within_budget"]


def budget_problems(spec: SweepSpec, plan: SweepPlan) -> list[LocatedProblem]:
    """One problem at ``budget.max_trials`` when the plan runs more trials than it allows."""
    if plan.trial_count <= spec.budget.max_trials:
        return []
    return [(("budget", "max_trials"),
             f"the plan has {plan.trial_count} trials, over budget.max_trials = "
             f"{spec.budget.max_trials}; raise the budget or shrink the axes")]


def build_plan_within_budget(spec: SweepSpec, facts: TrainFacts | None = None) -> SweepPlan:
    """:func:`~sweeps.plan.build.build_plan` (``facts``: the train split as the caller reads
    it), refused over ``budget.max_trials``.

    Raises:
        pydantic.ValidationError: located at ``budget.max_trials``, as the spec's own checks
            are, so the API answers it with the same 422 and the CLI prints the same line.
    """
    plan = build_plan(spec, facts)
    problems = budget_problems(spec, plan)
    if problems:
        raise located_errors("SweepSpec", problems)
    return plan

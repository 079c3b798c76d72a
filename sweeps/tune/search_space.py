"""The Ray Tune search space of a plan (the runner's ``param_space``).

Grid and random search run the plan's trials (deduplicated for grid; random's points drawn
by the planner from ``search.seed``): one grid axis over trial (or cohort) indices, and every
param read from the plan's trial at that index, so a trial that stands in several rows runs
once. Optuna samples alpha (and beta, free bits when given as ranges) from their
distributions as it runs.
"""

from __future__ import annotations

from typing import Any

from ray import tune

from sweeps.plan.build import SEARCH_AXES, SweepPlan
from sweeps.plan.identity import TRIAL_HASH
from sweeps.spec import SweepSpec, ValueRange
from sweeps.spec.checks import KL_AXES

__all__ = ["COHORT_INDEX", "MEMBERS", "TRIAL_INDEX", "is_cohort", "lone_params", "param_space"]

TRIAL_INDEX = "trial_index"
SHARED_BY = "shared_by"
COHORT_INDEX = "cohort_index"
MEMBERS = "members"


def is_cohort(config: dict[str, Any] | None) -> bool:
    """Whether a Tune trial's config is a cohort's (its ``members`` list the trials it trains)."""
    return bool(config) and isinstance(config.get(MEMBERS), list)


def _from_trial(trials: list[dict[str, Any]], key: str):
    return tune.sample_from(lambda config: trials[config[TRIAL_INDEX]].get(key))


def _distribution(value: Any):
    if isinstance(value, ValueRange):
        return tune.loguniform(value.low, value.high) if value.log else tune.uniform(value.low, value.high)
    return tune.grid_search([float(v) for v in value])


def _cohort_space(cohorts: list[list[dict[str, Any]]], keys: list[str]) -> dict[str, Any]:
    """One Tune trial per cohort. A cohort of K > 1 has ``members`` (each member's params
    exactly as a lone trial's config); a cohort of one is a lone trial: its params at the top
    level and ``members`` None, so the lone trainable runs it (:func:`is_cohort`)."""
    def lone(key: str):
        return tune.sample_from(lambda config: None if len(cohorts[config[COHORT_INDEX]]) > 1
                                else cohorts[config[COHORT_INDEX]][0].get(key))

    return {COHORT_INDEX: tune.grid_search(list(range(len(cohorts)))),
            MEMBERS: tune.sample_from(lambda config: cohorts[config[COHORT_INDEX]]
                                      if len(cohorts[config[COHORT_INDEX]]) > 1 else None),
            **{key: lone(key) for key in (TRIAL_INDEX, *keys)}}


def lone_params(config: dict[str, Any]) -> dict[str, Any]:
    """A lone trial's params from its Tune config (without the cohort keys)."""
    return {k: v for k, v in config.items() if k not in (COHORT_INDEX, MEMBERS)}


def param_space(spec: SweepSpec, plan: SweepPlan) -> dict[str, Any]:
    """The Tune param space: ``alpha, loss_stack, model, seed`` (+ ``beta, free_bits, target_rate`` when
    swept) and, for grid and random search (whose points the plan holds), ``trial_index`` and
    ``shared_by`` (the rows a shared trial stands for, comma-separated; empty when it stands
    for one), and ``trial_hash`` when the driver hashed the plan (every run is tagged with it). With cohorts (``plan.cohort_size > 1``): ``cohort_index`` and ``members``
    (:func:`_cohort_space`). Optuna samples its points from the distributions as it runs.
    ``plan`` is the spec's (:func:`~sweeps.plan.build.build_plan`), built once by the driver."""
    if spec.search.kind != "optuna":
        trials = [
            {**{k: trial[k] for k in (*SEARCH_AXES, TRIAL_HASH) if k in trial},
             SHARED_BY: ",".join(trial["shared_by"])}
            for trial in plan.trials
        ]
        keys = [k for k in (*SEARCH_AXES, SHARED_BY, TRIAL_HASH) if k in trials[0]]
        if plan.cohort_size > 1:
            return _cohort_space(
                [[{TRIAL_INDEX: i, **trials[i]} for i in members] for members in plan.cohorts], keys)
        return {TRIAL_INDEX: tune.grid_search(list(range(len(trials)))),
                **{key: _from_trial(trials, key) for key in keys}}
    stacks, models = spec.stack_labels(), list(spec.models)
    space: dict[str, Any] = {
        "alpha": _distribution(spec.alpha),
        "loss_stack": tune.choice(stacks) if len(stacks) > 1 else stacks[0],
        "model": tune.choice(models) if len(models) > 1 else models[0],
    }
    for axis in KL_AXES:
        if getattr(spec, axis) is not None:
            space[axis] = _distribution(getattr(spec, axis))
    space["seed"] = spec.seed_list()[0]  # one configuration per trial
    return space

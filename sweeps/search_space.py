"""The Ray Tune search space of a plan (the runner's ``param_space``).

Grid search runs the plan's deduplicated trials: one grid axis over trial indices, and
every param read from the plan's trial at that index, so a trial that stands in several
rows runs once. Random and Optuna search sample alpha (and beta, free bits when given as
ranges) from their distributions; nothing can be deduplicated before sampling.
"""

from __future__ import annotations

from typing import Any

from ray import tune

from sweeps.plan import TRIAL_AXES, build_plan
from sweeps.spec import SweepSpec, ValueRange

__all__ = ["COHORT_INDEX", "MEMBERS", "TRIAL_INDEX", "is_cohort", "param_space"]

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


def param_space(spec: SweepSpec) -> dict[str, Any]:
    """The Tune param space: ``alpha, loss_stack, model, seed`` (+ ``beta, free_bits`` when
    swept) and, for grid search, ``trial_index`` and ``shared_by`` (the rows a shared trial
    stands for, comma-separated; empty when it stands for one). With cohorts (grid search,
    ``plan.cohort_size > 1``): ``cohort_index`` and ``members``, one such dict per member."""
    stacks, models, seeds = spec.stack_labels(), list(spec.models), spec.seed_list()
    if spec.search.kind == "grid":
        plan = build_plan(spec)
        trials = [
            {**{k: trial[k] for k in TRIAL_AXES if k in trial},
             SHARED_BY: ",".join(trial["shared_by"])}
            for trial in plan.trials
        ]
        if plan.cohort_size > 1:
            # One Tune trial per cohort; ``members`` holds each member's params exactly as a
            # lone trial's config would (trial_index included).
            cohorts = [[{TRIAL_INDEX: i, **trials[i]} for i in members] for members in plan.cohorts]
            return {COHORT_INDEX: tune.grid_search(list(range(len(cohorts)))),
                    MEMBERS: tune.sample_from(lambda config: cohorts[config[COHORT_INDEX]])}
        keys = [k for k in (*TRIAL_AXES, SHARED_BY) if k in trials[0]]
        return {TRIAL_INDEX: tune.grid_search(list(range(len(trials)))),
                **{key: _from_trial(trials, key) for key in keys}}
    space: dict[str, Any] = {
        "alpha": _distribution(spec.alpha),
        "loss_stack": tune.choice(stacks) if len(stacks) > 1 else stacks[0],
        "model": tune.choice(models) if len(models) > 1 else models[0],
    }
    for axis in ("beta", "free_bits"):
        if getattr(spec, axis) is not None:
            space[axis] = _distribution(getattr(spec, axis))
    # Random search replicates every sampled configuration over the seeds; Optuna (one
    # configuration per trial) runs the spec's single seed.
    space["seed"] = tune.grid_search(seeds) if spec.search.kind == "random" else seeds[0]
    return space


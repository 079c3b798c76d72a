"""The report's sections read off the spec: what every trial trained with and on.

- :func:`selection_section`: how each trial's checkpoint was chosen, as the code does it.
- :func:`schedule_overruns`: the trials whose schedules did not finish within their run.
- :func:`data_section` and :func:`context_free_prior`: the data, the read-outs it cannot give
  and why, and the words a learned prior without context needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sweeps.plan.build import SweepPlan, trial_key
from sweeps.plan.units import listed, overrun_groups
from sweeps.report.readout_table import TrialOutcome
from sweeps.spec import SweepSpec
from workers.contract import RATE_TOLERANCE, SELECTION_METRIC, TEST_ELBO, TOTAL_STEPS_PARAM

__all__ = ["ORACLE_ABSENT_REASON", "context_free_prior", "data_section", "schedule_overruns",
           "selection_section"]

ORACLE_ABSENT_REASON = (
    "they need the oracle's h_t (each token's surprisal given the true latent) and the "
    "synthetic task's prefix/private kinds, and a registered dataset has neither")
"""Why a dataset trial has no oracle read-outs (the report says it in these words)."""


def selection_section(spec: SweepSpec) -> dict[str, Any]:
    """How every trial's checkpoint was chosen, as the code does it (one line in the report)."""
    training = spec.template.training
    stopping = (f"early stopping after {training.patience} epoch(s) without val/loss improving by "
                f"more than {training.min_delta:g}, from epoch {training.min_epochs}"
                if training.patience is not None else f"no early stopping (all {training.epochs} "
                "epochs run)")
    pretraining = (f"; epochs 1-{training.autoencoder_epochs} (autoencoder pre-training) never "
                   "chosen" if training.autoencoder_epochs else "")
    on_target = (f" among the epochs whose val rate is within {RATE_TOLERANCE:.0%} of the "
                 "trial's target rate (all epochs if none is)" if rate_controlled(spec) else "")
    return {"selection": training.selection, "metric": training.selection_metric or SELECTION_METRIC,
            "rule": training.selection_rule, "on_target": bool(on_target),
            "words": f"each trial's checkpoint is the epoch of {training.selection_rule}{on_target} "
                     f"(ties: the earlier epoch); {stopping}{pretraining}; test is read there."}


def rate_controlled(spec: SweepSpec) -> bool:
    """Whether any trial of ``spec`` trains to a target rate (the axis, or a kl option)."""
    def declares(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("target_rate") is not None or any(declares(v) for v in node.values())
        return isinstance(node, list) and any(declares(v) for v in node)
    return declares(spec.model_dump(mode="json"))


def schedule_overruns(spec: SweepSpec, plan: SweepPlan, outcomes: Sequence[TrialOutcome]) -> list[str]:
    """The trials whose KL annealing or Gumbel temperature decay did not finish within their
    run, grouped by kind: the run's steps as the trial logged them (else as planned)."""
    # Optuna plans hold distributions ("U[0, 4]") where a grid holds values: no planned steps there.
    planned = ({} if spec.search.kind == "optuna"
               else {trial_key(trial): trial.get("total_steps") for trial in plan.trials})
    trials, labels = [], []
    for outcome in sorted(outcomes, key=lambda o: o.trial_id):
        steps = outcome.final.get(TOTAL_STEPS_PARAM)
        steps = int(steps) if isinstance(steps, int | float) and math.isfinite(steps) else None
        if steps is None and spec.search.kind != "optuna":
            steps = planned.get(trial_key(outcome.params))
        if steps is None:
            continue
        config = spec.trial_config_for(outcome.params)
        trials.append({"total_steps": steps, "schedule_overruns": config.schedule_overruns(steps)})
        labels.append(outcome.trial_id)
    return [f"{len(names)} trial(s) ({listed(names)}) ran {steps} optimizer steps, within which "
            f"a schedule did not finish: {', '.join(overruns)}; their last steps did not train "
            "at the schedule's end value (give schedules relative to the run: warmup_fraction, "
            "cycles, gumbel_anneal_fraction)"
            for steps, overruns, names in overrun_groups(trials, labels)]


def data_section(spec: SweepSpec) -> dict[str, Any]:
    """What the sweep trained on, and which read-outs its data cannot give and why."""
    from workers.data.config import DatasetDataConfig

    data = spec.template.data
    if not isinstance(data, DatasetDataConfig):
        return {"source": "synthetic", "absent": []}
    absent = [{"readouts": "pi_explained_share, grad_share_explained, grad_share_prefix, the "
               "prefix-minus-private interaction", "why": ORACLE_ABSENT_REASON}]
    if spec.primary_metric == TEST_ELBO:
        absent.append({"readouts": "latent_nmi, latent_ari, mi_zs, nmi_auc, epochs_to_nmi90",
                       "why": "the dataset has no label column, so there is no latent class to "
                       "recover; the primary metric is test/elbo (sum over target tokens of l_t "
                       "plus KL per example, the same for every stack)"})
    return {"source": "dataset", "dataset": data.dataset, "sha256": data.sha256,
            "base": spec.template.base.kind, "absent": absent}


def context_free_prior(spec: SweepSpec) -> list[str]:
    """Words when a learned prior meets a dataset without context (x empty on every row, by its
    store record's token counts); nothing when the record cannot be read or holds other content."""
    from workers.data.config import DatasetDataConfig
    from workers.datasets.store import DatasetNotFound, DatasetStore

    data = spec.template.data
    if spec.template.model.prior != "learned" or not isinstance(data, DatasetDataConfig) or not data.root:
        return []
    try:
        record = DatasetStore(Path(data.root)).get(data.dataset)
    except (DatasetNotFound, OSError):
        return []
    tokens = record.summary.get("tokens") or {}
    if record.sha256 != data.sha256 or not tokens or any(split.get("x") for split in tokens.values()):
        return []
    return [f"The prior is learned (template.model.prior: learned) and dataset {data.dataset!r} has "
            "no context (x is empty on every row): p(z | x) is one distribution for every example "
            "and follows the aggregate posterior, so the KL reads about 0 even when every example "
            "sits on one category. Read I(x; z) and active units, not the KL; model.prior: "
            "standard keeps the KL a penalty."]

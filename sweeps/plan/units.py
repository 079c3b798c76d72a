"""Each planned trial's run and units: its optimizer steps, its beta in ELBO units, and the
schedules that do not finish within its run (torch-free).

A trial's run is ``epochs x ceil(train rows / batch_size)`` optimizer steps
(:mod:`objectives.schedules`); its beta in ELBO units is :mod:`objectives.units`' with the
train split's mean target length, as far as it is known before the trial measures c_base.
The train split's rows and mean length come from :class:`~workers.datasets.train_facts.TrainFacts`;
a number that is not known yet is said so (``unknown (why)``), never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from objectives.units import elbo_beta_before_c_base
from sweeps.spec import SweepSpec
from workers.datasets.train_facts import TrainFacts, train_facts

__all__ = ["annotate_trials", "default_facts", "listed", "overrun_groups", "schedule_warnings"]

SHOWN_TRIALS = 12


def default_facts(spec: SweepSpec) -> TrainFacts:
    """The spec's train facts from what it carries: the synthetic config, or a dataset the
    caller resolved (its ``root`` set); an unresolved dataset is not read."""
    return train_facts(spec.template.data)


def _optuna_config(spec: SweepSpec, trial: dict[str, Any]):
    """A sampled trial's schedules as its stack and model give them (alpha and beta are drawn
    as it runs and change neither its steps nor its schedules)."""
    stack = trial["loss_stack"] if trial["loss_stack"] in spec.stack_labels() else spec.stack_labels()[0]
    model = trial["model"] if trial["model"] in spec.models else spec.models[0]
    return spec.trial_config(0.0, stack, model, int(trial["seed"]))


def annotate_trials(spec: SweepSpec, trials: list[dict[str, Any]], facts: TrainFacts) -> None:
    """Give every trial ``total_steps`` (None when the train rows are not known),
    ``elbo_beta`` (text: a number, ``N x c_base`` or ``unknown (why)``) and
    ``schedule_overruns`` (words; empty when every schedule finishes or the steps are unknown)."""
    optuna = spec.search.kind == "optuna"
    for trial in trials:
        config = _optuna_config(spec, trial) if optuna else spec.trial_config_for(trial)
        total = None if facts.rows is None else config.total_steps(facts.rows)
        trial["total_steps"] = total
        trial["elbo_beta"] = ("depends on the beta Optuna samples" if optuna and spec.beta is not None
                              else elbo_beta_before_c_base(config.loss_stack, facts.mean_target_length,
                                                           facts.source).describe())
        trial["schedule_overruns"] = [] if total is None else config.schedule_overruns(total)


def overrun_groups(trials: list[dict[str, Any]], labels: list[str]
                   ) -> list[tuple[int | None, tuple[str, ...], list[str]]]:
    """``(steps, overruns, labels)`` per kind of overrun: the trials (named by ``labels``) whose
    schedule does not finish within their run of ``steps`` optimizer steps."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for label, trial in zip(labels, trials, strict=True):
        if trial.get("schedule_overruns"):
            groups[(trial["total_steps"], tuple(trial["schedule_overruns"]))].append(label)
    return [(steps, overruns, names) for (steps, overruns), names in groups.items()]


def listed(names: list[str]) -> str:
    """The first :data:`SHOWN_TRIALS` names, comma-separated, and how many more."""
    more = f" and {len(names) - SHOWN_TRIALS} more" if len(names) > SHOWN_TRIALS else ""
    return ", ".join(names[:SHOWN_TRIALS]) + more


def schedule_warnings(trials: list[dict[str, Any]]) -> list[str]:
    """One line per kind of overrun: the trials (1-based) whose schedule does not finish within
    their run, their steps, and which schedule."""
    labels = [str(number) for number in range(1, len(trials) + 1)]
    return [f"{len(names)} trial(s) ({listed(names)}) run {steps} optimizer steps, within which "
            f"a schedule does not finish: {', '.join(overruns)} (give it relative to the run: "
            "warmup_fraction, cycles, gumbel_anneal_fraction)"
            for steps, overruns, names in overrun_groups(trials, labels)]

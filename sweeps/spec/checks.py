"""Cross-field checks of a sweep spec: each returns messages that name the fields involved."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from objectives.field_errors import LocatedProblem
from objectives.spec import PRESETS, LossStackSpec
from sweeps.spec.sections import ValueRange

if TYPE_CHECKING:
    from sweeps.spec.sweep import SweepSpec

# A sweep's name and an inline stack's label, 1-100 characters (a registered dataset's or
# model's name: workers.contract.REGISTERED_NAME_PATTERN, 1-64).
SPEC_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


def stack_problems(stacks: list[str | LossStackSpec]) -> list[LocatedProblem]:
    """Unknown presets, unnamed or badly named inline stacks, alpha/c_base set, repeated labels
    (each located inside ``loss_stacks``)."""
    problems: list[LocatedProblem] = []
    labels: list[str] = []
    for i, stack in enumerate(stacks):
        if isinstance(stack, str):
            if stack not in PRESETS:
                problems.append(((i,), f"unknown preset {stack!r}; valid presets: "
                                       f"{', '.join(PRESETS)}"))
            labels.append(stack)
            continue
        if stack.name is None:
            problems.append(((i, "name"), "an inline stack needs a name (its label in reports)"))
        elif re.fullmatch(SPEC_NAME_PATTERN, stack.name) is None:
            problems.append(((i, "name"), f"{stack.name!r} must match {SPEC_NAME_PATTERN} (letters, "
                                          "digits, '_', '.', '-')"))
        else:
            labels.append(stack.name)
        if "alpha" in stack.model_fields_set:
            problems.append(((i, "alpha"), "alpha is swept at the sweep level; remove it"))
        if "c_base" in stack.model_fields_set:
            problems.append(((i, "c_base"),
                             "c_base is measured on the training split by each trial; remove it"))
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        problems.append(((), f"duplicate labels {', '.join(repeated)}; each stack needs its own "
                             "label (rename the inline stack)"))
    return problems


def _axis_problems(spec: SweepSpec) -> list[LocatedProblem]:
    problems = []
    kind = spec.search.kind
    for axis in ("alpha", "beta", "free_bits", "target_rate"):
        value = getattr(spec, axis)
        if isinstance(value, list) and kind != "grid":
            problems.append(((axis,), f"{axis}: a list of values is a grid; use search.kind=grid, "
                             f"or give {axis} as {{low, high}} for random/optuna search"))
        if isinstance(value, ValueRange) and kind == "grid":
            problems.append(((axis,), f"{axis}: a range needs search.kind random or optuna (got "
                             f"search.kind={kind}); or give {axis} as a list of values for a grid"))
    if isinstance(spec.target_rate, list) and 0 in spec.target_rate:
        problems.append((("target_rate",), "target_rate: 0 is not a rate; list target rates > 0 "
                         "nats (leave target_rate unset for no rate control)"))
    return problems


KL_AXES = ("beta", "free_bits", "target_rate")
"""The swept axes a trial applies to its stack's kl term (weight, free bits, target rate)."""


def _kl_problems(spec: SweepSpec) -> list[LocatedProblem]:
    """beta/free_bits/target_rate need a kl term; free bits must stay below log K (else KL has
    no pressure)."""
    problems = []
    swept = [axis for axis in KL_AXES if getattr(spec, axis) is not None]
    k = getattr(spec.template.data, "num_strategies", None)
    if k is None:  # a dataset: K is its label count, checked per trial (TrialConfig, Trainer)
        return problems
    limit = math.log(k)
    offenders: dict[float, list[str]] = {}
    for label in spec.stack_labels():
        terms = spec.stack_spec(label, 1.0).resolved_terms()
        if "kl" not in terms:
            if swept:
                problems.append(((swept[0],), f"{', '.join(swept)}: stack {label!r} has no kl "
                                 "term to apply it to; add kl to common_terms or to the stack"))
            continue
        options = terms["kl"].options
        if options.get("free_bits_mode", "example") != "example":
            continue
        values = spec.free_bits_values() if spec.free_bits is not None else [
            float(options.get("free_bits", 0.0))]
        for value in values:
            if value > 0 and value >= limit:
                offenders.setdefault(value, []).append(label)
    for value, labels in offenders.items():
        where = "free_bits" if spec.free_bits is not None else (
            f"the kl free_bits of stack(s) {', '.join(labels)} (common_terms.kl.options.free_bits "
            "or the stack's own kl term)")
        loc = ("free_bits",) if spec.free_bits is not None else (
            "common_terms", "kl", "options", "free_bits")
        problems.append((loc,
            f"{where}: free bits {value:g} nats >= log K = {limit:.3f} "
            f"(K = template.data.num_strategies = {k}) lets z "
            "carry the strategy without any KL pressure; use free bits below log K, or 0"))
    return problems


def _analysis_problems(spec: SweepSpec) -> list[LocatedProblem]:
    labels = set(spec.stack_labels())
    problems = []
    for i, contrast in enumerate(spec.analysis.contrasts or []):
        for field in ("stack", "baseline"):
            if getattr(contrast, field) not in labels:
                problems.append((("analysis", "contrasts", i, field),
                    f"analysis.contrasts[{i}].{field}: {getattr(contrast, field)!r} is not a swept "
                    f"stack; stacks: {', '.join(spec.stack_labels())}"))
    if spec.analysis.primary == "caveat":
        for field in ("caveat_treated", "caveat_control"):
            if getattr(spec.analysis, field) not in labels:
                problems.append((("analysis", field),
                    f"analysis.{field}: analysis.primary=caveat needs the stack "
                    f"{getattr(spec.analysis, field)!r} in loss_stacks"))
    return problems


def _search_problems(spec: SweepSpec) -> list[LocatedProblem]:
    problems = []
    kind = spec.search.kind
    metric_count = len(spec.objective.metrics)
    if metric_count > 1 and kind != "optuna":
        problems.append((("objective", "metrics"),
            f"{metric_count} metrics make a multi-objective search, which "
            f"needs search.kind=optuna (got search.kind={kind}); keep one metric"))
    if metric_count > 1 and spec.scheduler.kind == "asha":
        problems.append((("objective", "metrics"),
            f"scheduler.kind=asha stops trials on one metric, but "
            f"{metric_count} are given; use scheduler.kind=fifo or keep one metric"))
    if kind == "optuna" and len(spec.seed_list()) > 1:
        problems.append((("seeds",),
            "optuna samples one configuration per trial; use a single seed, or grid "
            "search for replicates"))
    size = spec.resources.cohort_size
    if size != "auto" and size > 1 and (kind == "optuna" or spec.scheduler.kind == "asha"):
        why = ("scheduler.kind=asha stops trials one by one" if spec.scheduler.kind == "asha"
               else "search.kind=optuna proposes each trial after the results before it")
        problems.append((("resources", "cohort_size"),
            f"resources.cohort_size={size} needs search.kind grid or random with scheduler.kind="
            f"fifo ({why}, so these run with cohort size 1); set resources.cohort_size: 1 "
            f"(or auto)"))
    epochs = spec.template.training.epochs
    max_t = spec.scheduler.max_t
    if max_t is not None and max_t > epochs:
        problems.append((("scheduler", "max_t"),
                         f"scheduler.max_t ({max_t}) must be <= template.training.epochs ({epochs})"))
    if spec.scheduler.kind == "asha" and spec.scheduler.grace_period > (max_t or epochs):
        problems.append((("scheduler", "grace_period"),
            f"scheduler.grace_period ({spec.scheduler.grace_period}) must be <= "
            f"scheduler.max_t ({max_t or epochs}, default template.training.epochs)"))
    pretraining = spec.template.training.autoencoder_epochs
    if spec.scheduler.kind == "asha" and pretraining and spec.scheduler.grace_period <= pretraining:
        problems.append((("scheduler", "grace_period"),
            f"scheduler.grace_period ({spec.scheduler.grace_period}) must be above "
            f"template.training.autoencoder_epochs ({pretraining}): ASHA would stop trials on "
            f"epochs trained without the KL; raise it to at least {pretraining + 1}"))
    if max_t is not None and pretraining and max_t <= pretraining:
        problems.append((("scheduler", "max_t"),
            f"scheduler.max_t ({max_t}) must be above template.training.autoencoder_epochs "
            f"({pretraining}), or no trial trains with the KL"))
    return problems


def consistency_problems(spec: SweepSpec) -> list[LocatedProblem]:
    """Every contradiction between sections (the trial budget is the plan's:
    :mod:`sweeps.plan.budget`)."""
    problems = [*_axis_problems(spec), *_search_problems(spec)]
    if not problems:
        problems += _kl_problems(spec) + _analysis_problems(spec)
    return problems

"""The sections of a sweep spec besides its axes: search, scheduler, objective, budget,
resources, and the analysis the report runs (which contrasts, which family is primary)."""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workers.contract import (
    ACTIVE_UNITS,
    KL,
    LATENT_AMI,
    LATENT_METRICS,
    LATENT_NMI_SHUFFLED,
    METRIC_NAMES,
    MUTUAL_INFO,
    USED_CATEGORIES,
    VAL,
    VAL_LATENT_NMI,
    metric_name,
)

__all__ = [
    "DEFAULT_LATENT_IN_USE_NATS",
    "DEFAULT_MIN_EFFECT_AMI",
    "DEFAULT_OBJECTIVE_METRIC",
    "MAXIMISED_METRICS",
    "METRIC_NAMES",
    "READOUT_METRICS",
    "AlphaRange",
    "AnalysisSpec",
    "BetaRange",
    "BudgetSpec",
    "ContrastSpec",
    "FreeBitsRange",
    "ObjectiveSpec",
    "ResourcesSpec",
    "SchedulerSpec",
    "SearchSpec",
    "TrackingSpec",
    "ValueRange",
]

# Every metric a trial reports per epoch (METRIC_NAMES, docs/concepts/design.md, "What a trial
# records") is a valid objective metric. Latent recovery is better when higher; every loss, KL
# and concentration statistic when lower.
MAXIMISED_METRICS = frozenset(metric_name(VAL, name) for name in LATENT_METRICS)
DEFAULT_OBJECTIVE_METRIC = VAL_LATENT_NMI
MAX_COHORT_SIZE = 256


class ValueRange(BaseModel):
    """A continuous range of one axis for random or Optuna search."""

    model_config = ConfigDict(extra="forbid")
    axis: ClassVar[str] = "value"

    low: float = Field(..., ge=0, allow_inf_nan=False, description="Smallest value (>= 0).")
    high: float = Field(..., allow_inf_nan=False, description="Largest value (> low).")
    log: bool = Field(
        False,
        description="Sample log-uniformly (needs low > 0). Useful when small values matter as "
        "much as large ones.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> ValueRange:
        axis = self.axis
        if self.high <= self.low:
            raise ValueError(f"{axis}.high ({self.high:g}) must be > {axis}.low ({self.low:g})")
        if self.log and self.low <= 0:
            raise ValueError(
                f"{axis}.low must be > 0 for a log range (log: true); use log: false to start at 0"
            )
        return self

    def describe(self) -> str:
        """The range as the plan shows it, e.g. ``U[0, 4]`` or ``logU[0.1, 4]``."""
        return f"{'logU' if self.log else 'U'}[{self.low:g}, {self.high:g}]"


class AlphaRange(ValueRange):
    """A continuous range of alpha for random or Optuna search."""

    axis: ClassVar[str] = "alpha"


class BetaRange(ValueRange):
    """A continuous range of beta (the KL weight) for random or Optuna search."""

    axis: ClassVar[str] = "beta"


class FreeBitsRange(ValueRange):
    """A continuous range of free bits (nats) for random or Optuna search."""

    axis: ClassVar[str] = "free_bits"


class SearchSpec(BaseModel):
    """How trial configurations are chosen."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["grid", "random", "optuna"] = Field(
        "grid",
        description="'grid': every combination of alpha values, stacks, models and seeds. "
        "'random': num_samples draws of alpha from a range and of stack and model uniformly, each "
        "run once per seed. 'optuna': num_samples trials proposed by an Optuna sampler.",
    )
    sampler: Literal["tpe", "cmaes", "nsga2"] = Field(
        "tpe",
        description="Optuna sampler (search.kind=optuna only). nsga2 also handles several "
        "objective metrics.",
    )
    seed: int = Field(0, ge=0, description="Seed of the random/Optuna sampler (not of the trials).")
    num_samples: int = Field(
        8, ge=1, le=10_000, description="Sampled configurations (random and optuna; grid ignores it)."
    )
    dedup: bool = Field(
        True, description="Grid only: objective-identical rows (e.g. uniform at every alpha) share "
        "one trial. false runs every row as its own trial (benchmarks, replication checks).",
    )


class SchedulerSpec(BaseModel):
    """Whether and how unpromising trials are stopped early."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["fifo", "asha"] = Field(
        "fifo", description="'fifo': every trial runs all its epochs. 'asha': async successive halving."
    )
    grace_period: int = Field(
        1, ge=1, description="ASHA: epochs every trial runs before it can be stopped."
    )
    max_t: int | None = Field(
        None,
        ge=1,
        description="ASHA: epochs of the longest trial. Unset: template.training.epochs; never more.",
    )
    reduction_factor: float = Field(
        2.0, gt=1, allow_inf_nan=False,
        description="ASHA: 1/reduction_factor of the trials go on at each rung.",
    )


class ObjectiveSpec(BaseModel):
    """The metric(s) the search optimises and the report ranks by (final epoch values)."""

    model_config = ConfigDict(extra="forbid")

    metrics: list[str] = Field(
        default_factory=lambda: [DEFAULT_OBJECTIVE_METRIC],
        min_length=1,
        max_length=4,
        description="Metric names (see METRIC_NAMES); the first is the primary one. Several "
        "metrics make a multi-objective Optuna search. Unset: val/latent_nmi on the synthetic "
        "task, val/latent_ami on a dataset with a label column, test/elbo on one without.",
    )
    modes: list[Literal["max", "min"]] | None = Field(
        None,
        description="'max' or 'min' per metric. Unset: 'max' for latent recovery (nmi, ari, ami, "
        "mutual_info, active_units), 'min' for everything else.",
    )

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, metrics: list[str]) -> list[str]:
        for metric in metrics:
            if metric not in METRIC_NAMES:
                raise ValueError(
                    f"unknown metric {metric!r}; valid metrics: {', '.join(METRIC_NAMES)}"
                )
        if len(set(metrics)) != len(metrics):
            raise ValueError("objective.metrics must not repeat a metric")
        return metrics

    @model_validator(mode="after")
    def _modes_match(self) -> ObjectiveSpec:
        if self.modes is not None and len(self.modes) != len(self.metrics):
            raise ValueError(
                f"objective.modes has {len(self.modes)} entries but objective.metrics has "
                f"{len(self.metrics)}; give one mode per metric, or leave modes unset"
            )
        return self

    def resolved_modes(self) -> list[str]:
        """The given modes, or the default per metric."""
        if self.modes is not None:
            return list(self.modes)
        return ["max" if metric in MAXIMISED_METRICS else "min" for metric in self.metrics]


class BudgetSpec(BaseModel):
    """Limits on the whole sweep."""

    model_config = ConfigDict(extra="forbid")

    max_trials: int = Field(
        200, ge=1, le=10_000, description="Refuse a plan with more trials than this (a typo guard)."
    )
    max_concurrent_trials: int | None = Field(
        None, ge=1, description="Trials running at once. Unset: as many as the resources allow."
    )
    time_budget_s: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="Wall-clock limit of the sweep in seconds; running trials are stopped at it.",
    )
    max_failures_per_trial: int = Field(
        1, ge=0, le=10, description="Retries of a failed trial (from its last checkpoint)."
    )


class ResourcesSpec(BaseModel):
    """What one trial reserves on the cluster (fractions let trials share a device)."""

    model_config = ConfigDict(extra="forbid")

    cpu: float = Field(1.0, gt=0, allow_inf_nan=False, description="CPUs per trial.")
    gpu: float = Field(0.0, ge=0, allow_inf_nan=False, description="GPUs per trial (e.g. 0.25).")
    cohort_size: Literal["auto"] | Annotated[int, Field(ge=1, le=MAX_COHORT_SIZE)] = Field(
        "auto", description="Trials trained together as one vectorized cohort by one worker "
        "(grid and random search with the fifo scheduler). 'auto' (the default): ceil(trials / "
        "concurrent workers) capped at 32 (workers: budget.max_concurrent_trials, else 4); 1 for "
        "Optuna and ASHA, which decide trial by trial. 1: one trial per worker. A cohort of one "
        "trial runs as a lone trial. The cpu/gpu above are then reserved per cohort.")


class TrackingSpec(BaseModel):
    """What each trial writes to MLflow besides its params, per-epoch metrics and end state."""

    model_config = ConfigDict(extra="forbid")

    trial_plots: bool = Field(
        False, description="Draw five PNGs per trial run (kappa histograms of train, val and "
        "test, reconstruction curves, per-position profiles) under its 'plots/' artifacts. Off "
        "by default: they cost more than a cohort member's training on the CPU, and the MLflow "
        "UI charts the same per-epoch metrics. The sweep's own report plots are always drawn.")


READOUT_METRICS: tuple[str, ...] = (
    "latent_nmi", LATENT_AMI, LATENT_NMI_SHUFFLED, "latent_ari", "nmi_auc", MUTUAL_INFO,
    ACTIVE_UNITS, USED_CATEGORIES, KL, "loss", "recon_uniform", "kappa_mean",
)
"""Read-outs (names without split and kind) the report summarises by default."""
DEFAULT_LATENT_IN_USE_NATS = 0.05
DEFAULT_MIN_EFFECT_AMI = 0.03
"""``analysis.min_effect`` when unset and the metric is AMI: below the 0.05-0.08 AMI that five
seeds detect on real text, the size the caveat's effects may have (docs/concepts/rates.md)."""
POWER_TARGET = 0.8  # the power the report plans for (sweeps.report.power.POWER)
"""The test I(x; z) below which the report calls a cell's latent collapsed (docs/science/index.md)."""


class ContrastSpec(BaseModel):
    """One comparison of the report: ``stack - baseline``, paired by seed."""

    model_config = ConfigDict(extra="forbid")

    stack: str = Field(..., description="The loss-stack label being compared.")
    baseline: str = Field("uniform", description="The loss-stack label it is compared against.")
    primary: bool = Field(
        True, description="Part of the primary family (Holm within it) when `analysis.primary` is "
        "'stack_contrasts'; false: computed and shown as exploratory.")
    predicted: Literal["higher", "lower"] | None = Field(
        None, description="The sign the study predicts for stack - baseline on `analysis.metric`, "
        "written before the sweep runs; the report says whether a significant difference matches it.")


class AnalysisSpec(BaseModel):
    """What the report compares, and which comparisons carry its claim (the primary family).

    Everything that selects (best configuration, collapse beta) reads val; every number in
    the tables is test. Holm adjusts within the primary family only; all other contrasts are
    shown as exploratory.
    """

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        "latent_nmi",
        description="The read-out (name without split) the primary family compares on test. "
        "Unset: latent_nmi on the synthetic task; latent_ami (chance-corrected) on a dataset "
        "with a label column; elbo on a dataset without one.",
    )
    metrics: list[str] = Field(
        default_factory=lambda: list(READOUT_METRICS), min_length=1, max_length=40,
        description="Read-outs summarised in the report's cells (names without split or kind).",
    )
    contrasts: list[ContrastSpec] | None = Field(
        None,
        description="Pairs (stack, baseline). Unset: every swept stack against uniform (when "
        "uniform is swept).",
    )
    primary: Literal["stack_contrasts", "caveat", "caveat_across"] = Field(
        "stack_contrasts",
        description="'stack_contrasts': the contrasts above on `metric`, all examples. 'caveat': "
        "the caveat contrasts (R~ vs R_tok per kind and their prefix-private interaction). "
        "'caveat_across': the caveat interaction across two sweeps on two datasets or label sets "
        "((R~ - R_tok) on one minus on the other, paired by seed: `ksweep report ID1 ID2`); a "
        "sweep's own report then tests R~ - R_tok over all examples at each alpha > 0.",
    )
    caveat_treated: str = Field(
        "concentration_corrected", description="The stack label of R~ in the caveat contrasts."
    )
    caveat_control: str = Field(
        "raw_token_weighted", description="The stack label of R_tok in the caveat contrasts."
    )
    collapse_threshold: float = Field(
        0.9, gt=0, le=1, allow_inf_nan=False,
        description="Collapse beta of a stack: the largest beta whose mean val NMI is >= this.",
    )
    min_effect: float | None = Field(
        None,
        description="The smallest difference on `metric` the study must be able to see (in the "
        "metric's units): the report gives the seeds each primary contrast needs to detect it "
        f"with {POWER_TARGET:.0%} power. Unset: {DEFAULT_MIN_EFFECT_AMI:g} when `metric` is "
        "latent_ami; none otherwise (the report then gives only the smallest effect the seeds "
        "detect).",
    )
    latent_in_use_nats: float = Field(
        DEFAULT_LATENT_IN_USE_NATS, ge=0, allow_inf_nan=False,
        description="A cell's latent is in use when its mean test I(x; z) (mutual_info, nats) is "
        "at least this; below it the report calls the latent collapsed and words no contrast "
        "on a latent read-out as higher or lower when both sides are collapsed (or at chance).",
    )

    @field_validator("min_effect")
    @classmethod
    def _positive_effect(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"analysis.min_effect must be a positive finite difference in the "
                             f"metric's units (e.g. {DEFAULT_MIN_EFFECT_AMI:g} AMI), got {value!r}; "
                             "leave it unset for the default")
        return value

    def resolved_min_effect(self) -> float | None:
        """The declared effect, else the default for AMI, else None."""
        if self.min_effect is not None:
            return self.min_effect
        return DEFAULT_MIN_EFFECT_AMI if self.metric == LATENT_AMI else None

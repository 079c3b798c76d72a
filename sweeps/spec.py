"""The sweep spec: which alphas, loss stacks, model families and seeds to train, and how.

A spec is one pydantic model that rejects unknown fields at every level, so a typo
(``template.training.epochz``) fails validation instead of silently running the defaults.
Contradictions between sections (a grid of alphas with Optuna, several objective
metrics with ASHA, a plan over the trial budget) are rejected too, each with a
message that names the fields involved.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    FieldSerializationInfo,
    StringConstraints,
    Tag,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from objectives.field_errors import Problem, located_errors
from objectives.spec import PRESETS, LossStackSpec, TermSpec
from workers.contract import DEFAULT_OBJECTIVE_METRIC, MAXIMISED_METRICS, METRIC_NAMES
from workers.models.config import ModelConfig
from workers.train.config import TrialConfig

__all__ = [
    "METRIC_NAMES",
    "AlphaRange",
    "BudgetSpec",
    "ObjectiveSpec",
    "ResourcesSpec",
    "SchedulerSpec",
    "SearchSpec",
    "SweepSpec",
    "load_sweep_spec",
    "parse_sweep_spec",
]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
TAG_KEY_PATTERN = r"^[A-Za-z0-9_.-]{1,100}$"

# Every metric a trial reports per epoch (DESIGN.md), i.e. every valid objective metric, and
# which of them are better when higher: workers/contract.py.
_MAXIMISED = MAXIMISED_METRICS

ModelFamily = Literal["discrete", "continuous"]
StackLabel = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


class AlphaRange(BaseModel):
    """A continuous range of alpha for random or Optuna search."""

    model_config = ConfigDict(extra="forbid")

    low: float = Field(..., ge=0, allow_inf_nan=False, description="Smallest alpha (>= 0).")
    high: float = Field(..., allow_inf_nan=False, description="Largest alpha (> low).")
    log: bool = Field(
        False,
        description="Sample log-uniformly (needs low > 0). Useful when small alphas matter as "
        "much as large ones.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> AlphaRange:
        if self.high <= self.low:
            raise ValueError(f"alpha.high ({self.high:g}) must be > alpha.low ({self.low:g})")
        if self.log and self.low <= 0:
            raise ValueError(
                "alpha.low must be > 0 for a log range (log: true); use log: false to start at 0"
            )
        return self

    def describe(self) -> str:
        """The range as the plan shows it, e.g. ``U[0, 4]`` or ``logU[0.1, 4]``."""
        return f"{'logU' if self.log else 'U'}[{self.low:g}, {self.high:g}]"


AlphaValues = Annotated[
    list[Annotated[float, Field(ge=0, allow_inf_nan=False)]], Field(min_length=1, max_length=64)
]


def _alpha_kind(value: Any) -> str:
    return "range" if isinstance(value, dict | AlphaRange) else "values"


def _seeds_kind(value: Any) -> str:
    return "count" if isinstance(value, int) else "values"


def _stack_kind(value: Any) -> str:
    return "preset" if isinstance(value, str) else "inline"


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
        "metrics make a multi-objective Optuna search.",
    )
    modes: list[Literal["max", "min"]] | None = Field(
        None,
        description="'max' or 'min' per metric. Unset: 'max' for latent recovery (nmi, ari, "
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
        return ["max" if metric in _MAXIMISED else "min" for metric in self.metrics]


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


# Fields of the template that the axes replace (or that are ignored): never dumped.
_TEMPLATE_SWEPT: dict[str, Any] = {"name": True, "seed": True, "loss_stack": True,
                                   "model": {"family"}}


def _default_common_terms() -> dict[str, TermSpec]:
    # Free bits keep the KL from collapsing the latent before reconstruction has learned to use it.
    return {"kl": TermSpec(weight=1.0, options={"free_bits": 1.0})}


def _error_lines(error: ValidationError) -> str:
    return "; ".join(str(item["msg"]).removeprefix("Value error, ") for item in error.errors())


class SweepSpec(BaseModel):
    """A sweep: the axes alpha x loss stack x model family x seed over a template trial."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        ..., pattern=NAME_PATTERN, description="Sweep name (letters, digits, '_', '.', '-')."
    )
    description: str = Field("", max_length=2000, description="Free text shown in reports.")
    tags: dict[
        Annotated[str, StringConstraints(pattern=TAG_KEY_PATTERN)],
        Annotated[str, StringConstraints(max_length=500)],
    ] = Field(default_factory=dict, max_length=50, description="MLflow tags on every run.")
    template: TrialConfig = Field(
        default_factory=TrialConfig,
        description="Data, base model, model sizes and training budget shared by every trial. Its "
        "loss_stack, seed and model.family are replaced by the swept axes; its name is ignored.",
    )
    alpha: Annotated[
        Annotated[AlphaValues, Tag("values")] | Annotated[AlphaRange, Tag("range")],
        Discriminator(_alpha_kind),
    ] = Field(
        default_factory=lambda: [0.0, 1.0, 2.0],
        description="A list of alpha values (grid search) or {low, high, log} (random/optuna).",
    )
    loss_stacks: list[
        Annotated[
            Annotated[str, Tag("preset")] | Annotated[LossStackSpec, Tag("inline")],
            Discriminator(_stack_kind),
        ]
    ] = Field(
        default_factory=lambda: ["uniform", "raw_plus_ncc"],
        min_length=1,
        max_length=16,
        description="Preset names or inline stacks (with a `name`, without alpha or c_base).",
    )
    common_terms: dict[str, TermSpec] = Field(
        default_factory=_default_common_terms,
        description="Terms added to every stack that does not define the term itself (the KL, "
        "typically).",
    )
    models: list[ModelFamily] = Field(
        default_factory=lambda: ["discrete"],
        min_length=1,
        max_length=2,
        description="Latent families to train: 'discrete' and/or 'continuous'.",
    )
    seeds: Annotated[
        Annotated[int, Field(ge=1, le=100), Tag("count")]
        | Annotated[
            list[Annotated[int, Field(ge=0, le=2**31 - 1)]],
            Field(min_length=1, max_length=100),
            Tag("values"),
        ],
        Discriminator(_seeds_kind),
    ] = Field(1, description="A count n (seeds 0..n-1) or an explicit list of seeds.")
    search: SearchSpec = Field(default_factory=SearchSpec, description="How trials are chosen.")
    scheduler: SchedulerSpec = Field(
        default_factory=SchedulerSpec, description="Early stopping of trials."
    )
    objective: ObjectiveSpec = Field(
        default_factory=ObjectiveSpec, description="What the search optimises."
    )
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="Limits on the sweep.")
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="Resources reserved per trial."
    )

    @field_validator("tags", mode="before")
    @classmethod
    def _scalar_tags_as_text(cls, value: Any) -> Any:
        # YAML reads `version: 2` as an int; MLflow tags are text either way.
        if isinstance(value, dict):
            return {k: str(v) if isinstance(v, int | float) else v for k, v in value.items()}
        return value

    @field_validator("alpha")
    @classmethod
    def _distinct_alphas(cls, value: list[float] | AlphaRange) -> list[float] | AlphaRange:
        if isinstance(value, list):
            repeated = sorted({a for a in value if value.count(a) > 1})
            if repeated:
                raise ValueError(
                    f"alpha: duplicate values {', '.join(f'{a:g}' for a in repeated)}; "
                    "list each value once"
                )
        return value

    @field_validator("loss_stacks")
    @classmethod
    def _valid_stacks(cls, stacks: list[str | LossStackSpec]) -> list[str | LossStackSpec]:
        problems: list[Problem] = []
        labels: list[str] = []
        for i, stack in enumerate(stacks):
            if isinstance(stack, str):
                if stack not in PRESETS:
                    problems.append(((i,), f"unknown preset {stack!r}; valid presets: {', '.join(PRESETS)}"))
                labels.append(stack)
                continue
            if stack.name is None:
                problems.append(((i, "name"), "an inline stack needs a name (its label in reports)"))
            elif not _matches(NAME_PATTERN, stack.name):
                problems.append(((i, "name"),
                    f"{stack.name!r} must match {NAME_PATTERN} (letters, digits, '_', '.', '-')"))
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
        if problems:
            raise located_errors(cls.__name__, problems)
        return stacks

    @field_validator("common_terms", mode="before")
    @classmethod
    def _weights_shorthand(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: {"weight": item}
                if isinstance(item, int | float) and not isinstance(item, bool) else item
                for key, item in value.items()
            }
        return value

    @field_validator("common_terms")
    @classmethod
    def _known_common_terms(cls, terms: dict[str, TermSpec]) -> dict[str, TermSpec]:
        if terms:
            try:
                LossStackSpec(terms=terms)
            except ValidationError as error:
                raise ValueError(f"common_terms: {_error_lines(error)}") from None
        return terms

    @field_validator("models")
    @classmethod
    def _distinct_models(cls, models: list[str]) -> list[str]:
        if len(set(models)) != len(models):
            raise ValueError("models: list each family once")
        return models

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: int | list[int]) -> int | list[int]:
        if isinstance(seeds, list) and len(set(seeds)) != len(seeds):
            raise ValueError("seeds: duplicate seeds; list each seed once")
        return seeds

    @field_serializer("loss_stacks")
    def _dump_stacks(self, stacks: list[str | LossStackSpec], info: FieldSerializationInfo) -> list:
        # alpha and c_base are per trial; dumping their defaults would make the dump invalid.
        mode = "json" if info.mode_is_json() else "python"
        return [
            stack if isinstance(stack, str)
            else stack.model_dump(mode=mode, exclude={"alpha", "c_base"})
            for stack in stacks
        ]

    @field_serializer("template")
    def _dump_template(self, template: TrialConfig, info: FieldSerializationInfo) -> dict:
        # The swept and ignored fields are left out, so two specs that run the same trials
        # dump (and hash) the same.
        mode = "json" if info.mode_is_json() else "python"
        return template.model_dump(mode=mode, exclude=_TEMPLATE_SWEPT)

    @model_validator(mode="after")
    def _consistent(self) -> SweepSpec:
        problems: list[Problem] = []
        kind = self.search.kind
        if isinstance(self.alpha, list) and kind != "grid":
            problems.append((("alpha",),
                "a list of values is a grid; use search.kind=grid, or give alpha as "
                "{low, high} for random/optuna search"))
        if isinstance(self.alpha, AlphaRange) and kind == "grid":
            problems.append((("alpha",),
                f"a range needs search.kind random or optuna (got search.kind={kind}); "
                "or give alpha as a list of values for a grid"))
        metric_count = len(self.objective.metrics)
        if metric_count > 1 and kind != "optuna":
            problems.append((("objective", "metrics"),
                f"{metric_count} metrics make a multi-objective search, which "
                f"needs search.kind=optuna (got search.kind={kind}); keep one metric"))
        if metric_count > 1 and self.scheduler.kind == "asha":
            problems.append((("objective", "metrics"),
                f"scheduler.kind=asha stops trials on one metric, but "
                f"{metric_count} are given; use scheduler.kind=fifo or keep one metric"))
        if kind == "optuna" and len(self.seed_list()) > 1:
            problems.append((("seeds",),
                "optuna samples one configuration per trial; use a single seed, or grid "
                "search for replicates"))
        epochs = self.template.training.epochs
        max_t = self.scheduler.max_t
        if max_t is not None and max_t > epochs:
            problems.append((("scheduler", "max_t"),
                f"scheduler.max_t ({max_t}) must be <= template.training.epochs ({epochs})"))
        if self.scheduler.kind == "asha" and self.scheduler.grace_period > (max_t or epochs):
            problems.append((("scheduler", "grace_period"),
                f"scheduler.grace_period ({self.scheduler.grace_period}) must be <= "
                f"scheduler.max_t ({max_t or epochs}, default template.training.epochs)"))
        if not problems:
            count = self.trial_count()
            if count > self.budget.max_trials:
                problems.append((("budget", "max_trials"),
                    f"the plan has {count} trials, over budget.max_trials = "
                    f"{self.budget.max_trials}; raise the budget or shrink the axes"))
        if problems:
            raise located_errors(type(self).__name__, problems)
        return self

    # ---- the axes ---------------------------------------------------------------------------

    def alpha_values(self) -> list[float]:
        """The grid of alpha values. Raises ValueError for a range."""
        if isinstance(self.alpha, AlphaRange):
            raise ValueError("alpha is a range; it has no list of values")
        return list(self.alpha)

    def stack_labels(self) -> list[str]:
        """The label of each loss stack, in spec order (the ``loss_stack`` param of a trial)."""
        return [s if isinstance(s, str) else str(s.name) for s in self.loss_stacks]

    def stack_spec(self, label: str, alpha: float) -> LossStackSpec:
        """The stack called ``label`` at ``alpha``, with the common terms it lacks merged in.

        Raises:
            KeyError: no stack has that label.
        """
        labels = self.stack_labels()
        if label not in labels:
            raise KeyError(f"no loss stack labelled {label!r}; stacks: {', '.join(labels)}")
        entry = self.loss_stacks[labels.index(label)]
        base = LossStackSpec(preset=entry) if isinstance(entry, str) else entry
        own = base.resolved_terms()
        terms = {**base.terms, **{k: v for k, v in self.common_terms.items() if k not in own}}
        return LossStackSpec(name=label, preset=base.preset, alpha=alpha, terms=terms)

    def seed_list(self) -> list[int]:
        """The trial seeds: ``0..n-1`` for a count, else the list as given."""
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)

    def trial_count(self) -> int:
        """Trials the sweep runs: the grid size, num_samples x seeds (random) or num_samples."""
        seeds = len(self.seed_list())
        if self.search.kind == "grid":
            alphas = len(self.alpha) if isinstance(self.alpha, list) else 1
            return alphas * len(self.loss_stacks) * len(self.models) * seeds
        if self.search.kind == "random":
            return self.search.num_samples * seeds
        return self.search.num_samples

    def epochs_per_trial(self) -> int:
        """The most epochs one trial runs (ASHA's max_t, else the template's epochs)."""
        if self.scheduler.kind == "asha" and self.scheduler.max_t is not None:
            return self.scheduler.max_t
        return self.template.training.epochs

    def trial_config(self, alpha: float, loss_stack: str, model: str, seed: int) -> TrialConfig:
        """The template with one point of the axes applied (and a run name that says which).

        Raises:
            KeyError: unknown stack label. ValueError: a model family not in ``models``.
        """
        if model not in self.models:
            raise ValueError(f"model {model!r} is not swept; models: {', '.join(self.models)}")
        stack = self.stack_spec(loss_stack, alpha)
        family = ModelConfig.model_validate({**self.template.model.model_dump(), "family": model})
        return TrialConfig.model_validate(
            {
                **dict(self.template),
                "name": f"{model}-{loss_stack}-a{alpha:g}-s{seed}",
                "seed": seed,
                "model": family,
                "loss_stack": stack,
            }
        )

    def grid_points(self) -> list[dict[str, Any]]:
        """Every grid trial as ``{alpha, loss_stack, model, seed}``; model outermost, seed innermost.

        Raises:
            ValueError: the search is not a grid.
        """
        if self.search.kind != "grid":
            raise ValueError(f"grid_points needs search.kind=grid, not {self.search.kind}")
        return [
            {"alpha": alpha, "loss_stack": stack, "model": model, "seed": seed}
            for model, stack, alpha, seed in itertools.product(
                self.models, self.stack_labels(), self.alpha_values(), self.seed_list()
            )
        ]

    # ---- the objective ----------------------------------------------------------------------

    def objective_modes(self) -> list[str]:
        """'max'/'min' per objective metric (given, or the per-metric default)."""
        return self.objective.resolved_modes()

    @property
    def primary_metric(self) -> str:
        """The first objective metric: what single-objective search and ASHA optimise."""
        return self.objective.metrics[0]

    @property
    def primary_mode(self) -> str:
        """The mode of the primary metric."""
        return self.objective_modes()[0]

    # ---- serialisation ----------------------------------------------------------------------

    def to_yaml(self) -> str:
        """The full spec (defaults included) as YAML that parses back to an equal spec."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def canonical_json(self) -> str:
        """Sorted-key compact JSON of the full spec: equal specs give equal text (for hashing)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def _matches(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text) is not None


def parse_sweep_spec(text: str, format: Literal["yaml", "json"] = "yaml") -> SweepSpec:
    """Parse and validate a spec from YAML or JSON text.

    Raises:
        pydantic.ValidationError: an invalid spec (one entry per problem, with its path).
        ValueError: text that is not YAML/JSON, or not a mapping.
    """
    try:
        if format == "json":
            data = json.loads(text)
        elif format == "yaml":
            data = yaml.safe_load(text)
        else:
            raise ValueError(f"format must be 'yaml' or 'json', got {format!r}")
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"the sweep spec is not valid {format.upper()}: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"a sweep spec must be a mapping, got {type(data).__name__}")
    return SweepSpec.model_validate(data)


def load_sweep_spec(path: str | Path) -> SweepSpec:
    """Load a spec from a file: ``.json`` is read as JSON, anything else as YAML.

    Raises:
        pydantic.ValidationError, ValueError: as :func:`parse_sweep_spec`. OSError: unreadable.
    """
    path = Path(path)
    format = "json" if path.suffix.lower() == ".json" else "yaml"
    return parse_sweep_spec(path.read_text(), format=format)

"""The sweep spec: which alphas, betas, free bits, loss stacks, models and seeds to train, and how.

A spec is one pydantic model that rejects unknown fields at every level, so a typo
(``template.training.epochz``) fails validation instead of silently running the defaults.
Contradictions between sections (a grid of alphas with Optuna, several objective
metrics with ASHA, free bits that switch the KL off) are rejected too, each with a message
that names the fields involved (``sweeps.spec.checks``). The axes are expanded in one place
only, :mod:`sweeps.plan.build`, and the trial budget is checked on that plan
(:mod:`sweeps.plan.budget`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_validator,
)

from objectives.field_errors import located_errors
from objectives.spec import LossStackSpec, TermSpec
from sweeps.spec.checks import SPEC_NAME_PATTERN, consistency_problems, stack_problems
from sweeps.spec.sections import (
    AlphaRange,
    AnalysisSpec,
    BetaRange,
    BudgetSpec,
    FreeBitsRange,
    ObjectiveSpec,
    ResourcesSpec,
    SchedulerSpec,
    SearchSpec,
    TargetRateRange,
    TrackingSpec,
    ValueRange,
)
from sweeps.spec.trials import TrialConfigs
from workers.contract import LATENT_AMI, VAL_LATENT_AMI
from workers.data.config import DatasetDataConfig
from workers.train.config import TrialConfig

__all__ = ["SweepSpec"]

TAG_KEY_PATTERN = r"^[A-Za-z0-9_.-]{1,100}$"
# A tag value is text; a number is read as its text (YAML's `version: 2`), a boolean is refused.
TAG_VALUE_SCHEMA = {"anyOf": [{"type": "string", "maxLength": 500}, {"type": "number"}]}

ModelFamily = Literal["discrete", "continuous"]
StackLabel = Annotated[str, StringConstraints(pattern=SPEC_NAME_PATTERN)]

AxisValues = Annotated[
    list[Annotated[float, Field(ge=0, allow_inf_nan=False)]], Field(min_length=1, max_length=64)
]


def _range_kind(value: Any) -> str:
    return "range" if isinstance(value, dict | ValueRange) else "values"


def _seeds_kind(value: Any) -> str:
    return "count" if isinstance(value, int) else "values"


def _stack_kind(value: Any) -> str:
    return "preset" if isinstance(value, str) else "inline"


def _axis(range_type: type[ValueRange]) -> Any:
    return Annotated[
        Annotated[AxisValues, Tag("values")] | Annotated[range_type, Tag("range")],
        Discriminator(_range_kind),
    ]


# Fields of the template that the axes replace (or that are ignored): never dumped.
_TEMPLATE_SWEPT: dict[str, Any] = {"name": True, "seed": True, "loss_stack": True,
                                   "model": {"family"}}


def _default_common_terms() -> dict[str, TermSpec]:
    # beta = 1 and no free bits: free bits at or above log K would let z carry the strategy
    # without any KL pressure (the spec rejects that), so none is the safe default for every K.
    return {"kl": TermSpec(weight=1.0)}


def _error_lines(error: ValidationError) -> str:
    return "; ".join(str(item["msg"]).removeprefix("Value error, ") for item in error.errors())


class SweepSpec(BaseModel):
    """A sweep: the axes alpha x loss stack x model family x seed over a template trial."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        ..., pattern=SPEC_NAME_PATTERN, description="Sweep name (letters, digits, '_', '.', '-')."
    )
    description: str = Field("", max_length=2000, description="Free text shown in reports.")
    tags: dict[
        Annotated[str, StringConstraints(pattern=TAG_KEY_PATTERN)],
        Annotated[str, StringConstraints(max_length=500), WithJsonSchema(TAG_VALUE_SCHEMA)],
    ] = Field(default_factory=dict, max_length=50,
              description="MLflow tags on every run (numbers are kept as their text).")
    template: TrialConfig = Field(
        default_factory=TrialConfig,
        description="Data, base model, model sizes and training budget shared by every trial. Its "
        "loss_stack, seed and model.family are replaced by the swept axes; its name is ignored.",
    )
    alpha: _axis(AlphaRange) = Field(
        default_factory=lambda: [0.0, 1.0, 2.0],
        description="A list of alpha values (grid search) or {low, high, log} (random/optuna).",
    )
    beta: _axis(BetaRange) | None = Field(
        None,
        description="KL weight beta: a list (grid) or {low, high, log} (random/optuna). It "
        "replaces the weight of every stack's kl term. Unset: each stack's own kl weight. The "
        "report reads every result against effective beta and never picks 'the best beta'.",
    )
    free_bits: _axis(FreeBitsRange) | None = Field(
        None,
        description="Free bits of the kl term in nats (below log K, or 0): a list (grid) or a "
        "range. Replaces every stack's kl free_bits. Unset: each stack's own.",
    )
    target_rate: _axis(TargetRateRange) | None = Field(
        None,
        description="Target rate in nats of E[KL] per example (> 0): a list (grid) or a range. "
        "Sets every stack's kl target_rate, so each trial trains to that rate (its KL weight "
        "adjusted as it trains) and the report compares stacks at the same target rate "
        "(docs/concepts/rates.md). Unset: each stack's own (none: no rate control).",
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
    analysis: AnalysisSpec = Field(
        default_factory=AnalysisSpec, description="What the report compares (families, contrasts)."
    )
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec, description="What each trial's MLflow run gets (PNGs)."
    )
    reuse: Literal["none", "own", "visible"] = Field(
        "none", description="Reuse finished trials of earlier sweeps instead of training them "
        "again, matched by their content hash (everything that determines a trial's result, the "
        "training code and torch version included): 'own' the same owner's sweeps, 'visible' "
        "every sweep the service holds (`ksweep sweep run`: both mean every sweep of the MLflow "
        "store). A reused trial stays in its own MLflow run; the report lists it with its sweep "
        "and run id. 'none' (the default) trains every trial.",
    )

    @model_validator(mode="before")
    @classmethod
    def _dataset_defaults(cls, value: Any) -> Any:
        # On a registered dataset an unset objective or analysis metric is AMI, chance-corrected:
        # a label a latent finds by accident reads NMI > 0 there. The synthetic task keeps NMI
        # (docs/concepts/trials.md). Decided on the spec as written, so its dump keeps the choice.
        if not isinstance(value, dict):
            return value
        template = value.get("template")
        data = template.get("data") if isinstance(template, dict) else getattr(template, "data", None)
        if not (isinstance(data, dict) and "dataset" in data or isinstance(data, DatasetDataConfig)):
            return value
        value = dict(value)
        objective, analysis = value.get("objective", {}), value.get("analysis", {})
        if isinstance(objective, dict) and "metrics" not in objective:
            value["objective"] = {**objective, "metrics": [VAL_LATENT_AMI]}
        if isinstance(analysis, dict) and "metric" not in analysis:
            value["analysis"] = {**analysis, "metric": LATENT_AMI}
        return value

    @field_validator("tags", mode="before")
    @classmethod
    def _scalar_tags_as_text(cls, value: Any) -> Any:
        # YAML reads `version: 2` as an int; MLflow tags are text either way.
        if isinstance(value, dict):
            return {k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                    for k, v in value.items()}
        return value

    @field_validator("alpha", "beta", "free_bits", "target_rate")
    @classmethod
    def _distinct_values(cls, value: Any, info: Any) -> Any:
        if isinstance(value, list):
            repeated = sorted({a for a in value if value.count(a) > 1})
            if repeated:
                raise ValueError(
                    f"{info.field_name}: duplicate values {', '.join(f'{a:g}' for a in repeated)}; "
                    "list each value once"
                )
        return value

    @field_validator("loss_stacks")
    @classmethod
    def _valid_stacks(cls, stacks: list[str | LossStackSpec]) -> list[str | LossStackSpec]:
        problems = stack_problems(stacks)
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
        problems = consistency_problems(self)
        if problems:
            raise located_errors(type(self).__name__, problems)
        return self

    # ---- the axes ---------------------------------------------------------------------------

    def alpha_values(self) -> list[float]:
        """The grid of alpha values. Raises ValueError for a range."""
        if isinstance(self.alpha, ValueRange):
            raise ValueError("alpha is a range; it has no list of values")
        return list(self.alpha)

    def beta_values(self) -> list[float | None]:
        """The grid of beta values; ``[None]`` (each stack's own kl weight) when not swept."""
        if isinstance(self.beta, ValueRange):
            raise ValueError("beta is a range; it has no list of values")
        return [None] if self.beta is None else list(self.beta)

    def free_bits_values(self) -> list[float | None]:
        """The grid of free-bits values; ``[None]`` (each stack's own) when not swept."""
        if isinstance(self.free_bits, ValueRange):
            raise ValueError("free_bits is a range; it has no list of values")
        return [None] if self.free_bits is None else list(self.free_bits)

    def target_rate_values(self) -> list[float | None]:
        """The grid of target rates; ``[None]`` (each stack's own) when not swept."""
        if isinstance(self.target_rate, ValueRange):
            raise ValueError("target_rate is a range; it has no list of values")
        return [None] if self.target_rate is None else list(self.target_rate)

    def trial_configs(self) -> TrialConfigs:
        """What a trial needs to build its configuration from its params (not the whole spec)."""
        return TrialConfigs(self.template, tuple(self.models), tuple(self.loss_stacks),
                            dict(self.common_terms))

    def stack_labels(self) -> list[str]:
        """The label of each loss stack, in spec order (the ``loss_stack`` param of a trial)."""
        return self.trial_configs().stack_labels()

    def stack_spec(self, label: str, alpha: float, beta: float | None = None,
                   free_bits: float | None = None, target_rate: float | None = None) -> LossStackSpec:
        """:meth:`TrialConfigs.stack_spec <sweeps.spec.trials.TrialConfigs.stack_spec>`."""
        return self.trial_configs().stack_spec(label, alpha, beta, free_bits, target_rate)

    def seed_list(self) -> list[int]:
        """The trial seeds: ``0..n-1`` for a count, else the list as given."""
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)

    def epochs_per_trial(self) -> int:
        """The most epochs one trial runs (ASHA's max_t, else the template's epochs)."""
        if self.scheduler.kind == "asha" and self.scheduler.max_t is not None:
            return self.scheduler.max_t
        return self.template.training.epochs

    def trial_config(self, alpha: float, loss_stack: str, model: str, seed: int,
                     beta: float | None = None, free_bits: float | None = None,
                     target_rate: float | None = None) -> TrialConfig:
        """:meth:`TrialConfigs.trial_config <sweeps.spec.trials.TrialConfigs.trial_config>`."""
        return self.trial_configs().trial_config(alpha, loss_stack, model, seed, beta, free_bits,
                                                 target_rate)

    def trial_config_for(self, params: Mapping[str, Any]) -> TrialConfig:
        """:meth:`TrialConfigs.trial_config_for <sweeps.spec.trials.TrialConfigs.trial_config_for>`."""
        return self.trial_configs().trial_config_for(params)

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

"""The declarative side of the objective library: loss-stack specs, presets, the terms' declarations.

Pure pydantic (no torch), so the service can validate a sweep's loss stacks without the
training stack. The registry of term *descriptions* (:data:`TERM_INFO`: name, options
model, what the weight means) lives here; the torch functions that compute the terms are
registered under the same names in :mod:`objectives.terms`, and
:meth:`LossStackSpec.build` (which imports the torch side when called) joins the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from objectives.field_errors import LocatedProblem, located_errors
from objectives.options import BagOfWordsOptions, KLOptions, NoOptions, WeightingOptions

if TYPE_CHECKING:
    from objectives.stack import LossStack

__all__ = [
    "PRESETS",
    "TERM_INFO",
    "LossStackSpec",
    "Preset",
    "TermDeclaration",
    "TermSpec",
    "describe_presets",
    "describe_terms",
    "preset_spec",
]


@dataclass(frozen=True)
class TermDeclaration:
    """What a loss spec may say about a term (the torch function is registered separately).

    Attributes:
        name: the key used in loss-stack specs.
        summary: one line for people (shown by ``GET /objectives``).
        options_model: pydantic model of the term's options (unknown options are rejected).
        weight_name: what the spec's weight means for this term (``beta`` for KL).
        needs: LossInputs fields beyond token_nll/base_nll/mask the term reads.
        needs_c_base: whether the stack must know c_base.
        needs_train_kappa: whether the stack must know the train split's mean kappa at the
            term's alpha (measured by the trial, like c_base).
    """

    name: str
    summary: str
    options_model: type[BaseModel]
    weight_name: str = "weight"
    needs: tuple[str, ...] = ()
    needs_c_base: bool = False
    needs_train_kappa: bool = False

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable description: name, summary, weight meaning, inputs, options schema."""
        return {
            "name": self.name,
            "summary": self.summary,
            "weight": self.weight_name,
            "needs": list(self.needs),
            "needs_c_base": self.needs_c_base,
            "options": self.options_model.model_json_schema(),
        }


TERM_INFO: dict[str, TermDeclaration] = {
    info.name: info
    for info in (
        TermDeclaration("uniform", "Uniform token mean of l per example (the ordinary reconstruction NLL).",
                        NoOptions),
        TermDeclaration("normalized_uniform",
                        "Uniform token mean of l divided by c_base: the alpha = 0 endpoint of the "
                        "normalized family.", NoOptions, needs_c_base=True),
        TermDeclaration("token_weighted",
                        "R_tok,alpha = sum_t pi_t l_t: raw tempered surprisal-share token weighting.",
                        WeightingOptions),
        TermDeclaration("concentration_corrected",
                        "R~ = R_tok / kappa_alpha: token weighting with the concentration inflation "
                        "removed.", WeightingOptions),
        TermDeclaration("train_kappa_corrected",
                        "R_tok / mean_train(kappa_alpha): token weighting with one global correction, the "
                        "train split's mean concentration (R~ divides each example by its own); at beta it "
                        "trains like R_tok at beta * mean kappa.", WeightingOptions, needs_train_kappa=True),
        TermDeclaration("normalized_concentration_corrected",
                        "R^ = R~ / c_base: concentration-corrected and in z-free-relative units "
                        "(baseline mean 1).", WeightingOptions, needs_c_base=True),
        TermDeclaration("kl", "KL(q(z|x,y) || p(z|x)) with free bits and an optional annealing schedule "
                        "on beta.", KLOptions, weight_name="beta", needs=("kl",)),
        TermDeclaration("bag_of_words",
                        "kgCVAE bag-of-words loss: -log p_bow(y_t | z, x) over the active target tokens.",
                        BagOfWordsOptions, needs=("bow_logits", "targets")),
    )
}


def describe_terms() -> list[dict[str, Any]]:
    """Every registered term as a JSON-serialisable dict (for ``GET /objectives``)."""
    return [info.describe() for info in TERM_INFO.values()]


class TermSpec(BaseModel):
    """One term of a stack: its weight and its options."""

    model_config = ConfigDict(extra="forbid")
    weight: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="Multiplier of the term in the total (beta for kl). 0 computes and reports "
        "the term without training on it.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Term options; see GET /objectives for each term's."
    )


@dataclass(frozen=True)
class Preset:
    """A named stack of terms (weights and options)."""

    name: str
    summary: str
    terms: dict[str, dict[str, Any]]


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset("uniform", "Plain uniform token NLL.", {"uniform": {"weight": 1.0}}),
        Preset(
            "normalized_uniform",
            "Uniform token NLL / c_base (the alpha = 0 endpoint of the normalized family).",
            {"normalized_uniform": {"weight": 1.0}},
        ),
        Preset(
            "raw_token_weighted",
            "Raw tempered surprisal-share weighting R_tok alone.",
            {"token_weighted": {"weight": 1.0}},
        ),
        Preset(
            "train_kappa_corrected",
            "R_tok divided by the train split's mean kappa: R~'s global rescale without its "
            "per-example 1/kappa weight.",
            {"train_kappa_corrected": {"weight": 1.0}},
        ),
        Preset(
            "ncc",
            "Normalized concentration-corrected R^ alone.",
            {"normalized_concentration_corrected": {"weight": 1.0}},
        ),
        Preset(
            "raw_plus_ncc",
            "The research note's current stack: raw R_tok alongside the normalized "
            "concentration-corrected R^.",
            {"token_weighted": {"weight": 1.0}, "normalized_concentration_corrected": {"weight": 1.0}},
        ),
    )
}


def _unknown(kind: str, name: str, valid: list[str]) -> ValueError:
    return ValueError(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(sorted(valid))}")


class LossStackSpec(BaseModel):
    """A declarative loss stack: a preset and/or terms, with alpha and c_base.

    ``terms`` entries override or extend the preset's: ``{preset: raw_plus_ncc,
    terms: {kl: {weight: 1.0, options: {free_bits: 0.1}}}}``. A bare number is
    shorthand for ``{weight: number}``.
    """

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(
        None,
        max_length=100,
        description="Label of the stack in params and reports (default: the preset name, else "
        "the term names joined by '+').",
    )
    preset: str | None = Field(None, description=f"A named stack: {', '.join(PRESETS)}.")
    alpha: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="Concentration knob alpha >= 0 (0 = uniform)."
    )
    c_base: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="The z-free reference scale E_D[b_u]. Usually left unset and measured on the "
        "training split by the worker; required by normalized terms before the stack runs.",
    )
    terms: dict[str, TermSpec] = Field(default_factory=dict, description="Term name -> weight/options.")

    @field_validator("terms", mode="before")
    @classmethod
    def _weights_shorthand(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: {"weight": item} if isinstance(item, int | float) and not isinstance(item, bool)
                else item
                for key, item in value.items()
            }
        return value

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise _unknown("preset", value, list(PRESETS))
        return value

    @field_validator("terms")
    @classmethod
    def _known_terms_and_options(cls, terms: dict[str, TermSpec]) -> dict[str, TermSpec]:
        problems: list[LocatedProblem] = []
        for name, term in terms.items():
            if name not in TERM_INFO:
                problems.append(((name,), str(_unknown("loss term", name, list(TERM_INFO)))))
                continue
            options_model = TERM_INFO[name].options_model
            valid = list(options_model.model_fields)
            unknown = [option for option in term.options if option not in valid]
            problems.extend(
                ((name, "options", option), f"unknown option {option!r} for loss term {name!r}; "
                 f"valid options: {', '.join(valid) if valid else '(none)'}")
                for option in unknown
            )
            if unknown:
                continue
            try:
                options_model.model_validate(term.options)
            except ValidationError as error:
                problems.extend(((name, "options", *e["loc"]), e["msg"]) for e in error.errors())
        if problems:
            raise located_errors(cls.__name__, problems)
        return terms

    @model_validator(mode="after")
    def _at_least_one_term(self) -> LossStackSpec:
        if not self.resolved_terms():
            raise ValueError("a loss stack needs at least one term: set `preset` or `terms`")
        return self

    @model_validator(mode="after")
    def _target_rate_starts_priced(self) -> LossStackSpec:
        kl = self.resolved_terms().get("kl")
        if kl is not None and kl.options.get("target_rate") is not None and not kl.weight > 0:
            raise ValueError(
                f"terms.kl.weight ({kl.weight:g}) is the target-rate controller's starting beta and "
                "must be > 0 with terms.kl.options.target_rate; set a positive weight (e.g. 1.0)")
        return self

    def resolved_terms(self) -> dict[str, TermSpec]:
        """The preset's terms updated by ``terms`` (preset order first, then additions)."""
        merged: dict[str, TermSpec] = {}
        if self.preset is not None:
            merged = {k: TermSpec.model_validate(v) for k, v in PRESETS[self.preset].terms.items()}
        merged.update(self.terms)
        return merged

    @property
    def label(self) -> str:
        """The stack's name for params and reports."""
        if self.name:
            return self.name
        if self.preset:
            added = [name for name in self.terms if name not in PRESETS[self.preset].terms]
            return "+".join([self.preset, *added])
        return "+".join(self.resolved_terms())

    @property
    def needs_c_base(self) -> bool:
        """Whether any term is normalized by c_base."""
        return any(TERM_INFO[name].needs_c_base for name in self.resolved_terms())

    @property
    def needs_train_kappa(self) -> bool:
        """Whether any term divides by the train split's mean kappa."""
        return any(TERM_INFO[name].needs_train_kappa for name in self.resolved_terms())

    def term_alphas(self) -> set[float]:
        """The alphas the stack's terms weight at (a term's own ``alpha`` option, else the stack's)."""
        own = [term.options.get("alpha") for term in self.resolved_terms().values()]
        return {float(self.alpha if alpha is None else alpha) for alpha in own}

    def build(self, c_base: float | None = None, train_kappa: Mapping[float, float] | None = None,
              total_steps: int | None = None) -> LossStack:
        """The callable (torch) stack; ``c_base`` (if given) overrides the spec's; ``train_kappa``:
        alpha -> the train split's mean kappa, for the terms that need it; ``total_steps`` (the
        trial's optimizer steps) resolves schedules given relative to the run."""
        from objectives.stack import LossStack

        return LossStack(self, c_base=c_base, train_kappa=train_kappa, total_steps=total_steps)


def preset_spec(name: str, alpha: float = 1.0, c_base: float | None = None, **extra: Any) -> LossStackSpec:
    """The spec of a named preset, e.g. ``preset_spec("raw_plus_ncc", alpha=2.0)``."""
    return LossStackSpec(preset=name, alpha=alpha, c_base=c_base, **extra)


def describe_presets() -> list[dict[str, Any]]:
    """Presets as JSON-serialisable dicts (for ``GET /objectives``)."""
    return [{"name": p.name, "summary": p.summary, "terms": p.terms} for p in PRESETS.values()]

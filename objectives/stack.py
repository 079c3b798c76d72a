"""Loss stacks: a declarative spec of weighted terms, and the callable built from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from objectives._checks import check_c_base, check_pair, check_token_nll
from objectives.terms import TERMS, LossInputs, TermContext
from objectives.token_weighting import TokenWeightStats

__all__ = [
    "TermSpec",
    "LossStackSpec",
    "LossStack",
    "LossOutput",
    "PRESETS",
    "preset_spec",
    "describe_presets",
]


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
        for name, term in terms.items():
            if name not in TERMS:
                raise _unknown("loss term", name, list(TERMS))
            options_model = TERMS[name].options_model
            valid = list(options_model.model_fields)
            for option in term.options:
                if option not in valid:
                    raise ValueError(
                        f"unknown option {option!r} for loss term {name!r} (at {name}.options); "
                        f"valid options: {', '.join(valid) if valid else '(none)'}"
                    )
            try:
                options_model.model_validate(term.options)
            except ValidationError as error:
                details = "; ".join(
                    f"{name}.options.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                    for e in error.errors()
                )
                raise ValueError(f"invalid options for loss term {name!r}: {details}") from None
        return terms

    @model_validator(mode="after")
    def _at_least_one_term(self) -> LossStackSpec:
        if not self.resolved_terms():
            raise ValueError("a loss stack needs at least one term: set `preset` or `terms`")
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
        return any(TERMS[name].needs_c_base for name in self.resolved_terms())

    def build(self, c_base: float | None = None) -> LossStack:
        """The callable stack; ``c_base`` (if given) overrides the spec's."""
        return LossStack(self, c_base=c_base)


def preset_spec(name: str, alpha: float = 1.0, c_base: float | None = None, **extra: Any) -> LossStackSpec:
    """The spec of a named preset, e.g. ``preset_spec("raw_plus_ncc", alpha=2.0)``."""
    return LossStackSpec(preset=name, alpha=alpha, c_base=c_base, **extra)


def describe_presets() -> list[dict[str, Any]]:
    """Presets as JSON-serialisable dicts (for ``GET /objectives``)."""
    return [{"name": p.name, "summary": p.summary, "terms": p.terms} for p in PRESETS.values()]


@dataclass
class LossOutput:
    """The result of one stack call.

    Attributes:
        total: scalar ``sum_k weight_k * factor_k(step) * value_k`` (the training loss).
        terms: term name -> scalar unweighted value (still on the device, with graph).
        weights: term name -> the effective weight used at this step (annealing included).
        stats: float64 token-weight statistics at the stack's alpha when a term computed them.
    """

    total: torch.Tensor
    terms: dict[str, torch.Tensor]
    weights: dict[str, float]
    stats: TokenWeightStats | None = None


class LossStack:
    """A built loss stack. Call it with :class:`LossInputs`; no host sync happens inside.

    Raises (at construction):
        ValueError: a normalized term without a positive c_base.
    """

    def __init__(self, spec: LossStackSpec, c_base: float | None = None) -> None:
        self.spec = spec
        self.alpha = spec.alpha
        chosen = c_base if c_base is not None else spec.c_base
        if spec.needs_c_base:
            if chosen is None:
                raise ValueError(
                    "c_base is required by the normalized terms of this stack "
                    f"({', '.join(n for n in spec.resolved_terms() if TERMS[n].needs_c_base)}); "
                    "measure it with ReferenceScale and pass build(c_base=...)"
                )
            chosen = check_c_base(chosen)
        self.c_base = chosen
        self._terms = [
            (name, TERMS[name], term.weight, TERMS[name].options_model.model_validate(term.options))
            for name, term in spec.resolved_terms().items()
        ]

    @property
    def term_names(self) -> list[str]:
        """Names of the terms, in evaluation order."""
        return [name for name, *_ in self._terms]

    def __call__(self, inputs: LossInputs) -> LossOutput:
        check_pair(inputs.base_nll, inputs.mask)
        check_token_nll(inputs.token_nll, inputs.base_nll)
        context = TermContext(alpha=self.alpha, c_base=self.c_base)
        values: dict[str, torch.Tensor] = {}
        weights: dict[str, float] = {}
        total = torch.zeros((), dtype=inputs.token_nll.dtype, device=inputs.token_nll.device)
        for name, definition, weight, options in self._terms:
            for needed in definition.needs:
                if getattr(inputs, needed) is None:
                    raise ValueError(f"loss term {name!r} needs LossInputs.{needed}, which is None")
            value = definition.compute(inputs, context, options)
            factor = definition.weight_factor(options, inputs.step) if definition.weight_factor else 1.0
            values[name] = value
            weights[name] = weight * factor
            if weights[name] != 0.0:
                total = total + weights[name] * value.to(total.dtype)
        return LossOutput(total, values, weights, context._stats.get(self.alpha))

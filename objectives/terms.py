"""The registry of loss terms a loss stack may combine.

Each term is a named, documented function of the batch with a pydantic model
of its options. Terms are found only by name in this registry: nothing in a
user's spec is ever resolved as an import path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from objectives.token_weighting import (
    TokenWeightStats,
    _divide_by_kappa,
    _r_tok,
    _stats,
    masked_example_mean,
    working_dtype,
)

__all__ = [
    "LossInputs",
    "TermContext",
    "TermDefinition",
    "TERMS",
    "register_term",
    "NoOptions",
    "WeightingOptions",
    "KLOptions",
    "BagOfWordsOptions",
    "kl_anneal_factor",
]


@dataclass
class LossInputs:
    """What one batch offers the terms. Only the fields a stack's terms need must be set.

    Attributes:
        token_nll: ``[B, T]`` decoder NLL per token (the only tensor with gradient to recon terms).
        base_nll: ``[B, T]`` z-free base surprisal b_t (treated as a constant).
        mask: ``[B, T]`` bool, True on active y-region tokens.
        kl: ``[B]`` KL(q(z|x,y) || p(z|x)) per example, or ``[B, D]`` per latent dimension
            (needed by ``kl``; per-dimension free bits need ``[B, D]``).
        bow_logits: ``[B, V]`` bag-of-words logits predicted from (z, x) (needed by ``bag_of_words``).
        targets: ``[B, T]`` int64 target tokens y (needed by ``bag_of_words``).
        step: the global optimisation step, for KL annealing schedules (a Python int).
    """

    token_nll: torch.Tensor
    base_nll: torch.Tensor
    mask: torch.Tensor
    kl: torch.Tensor | None = None
    bow_logits: torch.Tensor | None = None
    targets: torch.Tensor | None = None
    step: int = 0


@dataclass
class TermContext:
    """Stack-level settings shared by the terms of one call, with per-alpha caches.

    Terms at the same alpha share one computation of the weights and of R_tok.
    """

    alpha: float
    c_base: float | None
    _stats: dict[float, TokenWeightStats] = field(default_factory=dict)
    _r_tok: dict[float, torch.Tensor] = field(default_factory=dict)

    def stats(self, inputs: LossInputs, alpha: float | None = None) -> TokenWeightStats:
        """Token-weight statistics at ``alpha`` (default the stack's) in the working dtype."""
        key = self.alpha if alpha is None else alpha
        if key not in self._stats:
            dtype = working_dtype(inputs.token_nll, inputs.base_nll)
            self._stats[key] = _stats(inputs.base_nll, inputs.mask, key, dtype)
        return self._stats[key]

    def r_tok(self, inputs: LossInputs, alpha: float | None = None) -> torch.Tensor:
        """Per-example R_tok at ``alpha`` (default the stack's), ``[B]``."""
        key = self.alpha if alpha is None else alpha
        if key not in self._r_tok:
            self._r_tok[key] = _r_tok(inputs.token_nll, inputs.mask, self.stats(inputs, key))
        return self._r_tok[key]


class NoOptions(BaseModel):
    """This term takes no options."""

    model_config = ConfigDict(extra="forbid")


class WeightingOptions(BaseModel):
    """Options of the token-weighted reconstruction terms."""

    model_config = ConfigDict(extra="forbid")
    alpha: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="Override the stack's alpha for this term only (e.g. a raw term at alpha = 1 "
        "beside a corrected one at alpha = 2). Unset: the stack's alpha.",
    )


class KLOptions(BaseModel):
    """Options of the KL term. Its weight is beta."""

    model_config = ConfigDict(extra="forbid")
    free_bits: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="Free bits lambda in nats: KL below lambda is not penalised (0 = off).",
    )
    free_bits_mode: Literal["example", "dimension"] = Field(
        "example",
        description="'example': mean_b max(lambda, sum_d KL_bd). 'dimension' (Kingma et al. 2016): "
        "sum_d max(lambda, mean_b KL_bd), which needs kl of shape [B, D].",
    )
    anneal: Literal["none", "linear", "cyclical"] = Field(
        "none",
        description="Schedule of the factor multiplying beta: 'linear' ramps from `anneal_start` to 1 "
        "over `warmup_steps`; 'cyclical' (Fu et al. 2019) repeats, every `cycle_steps`, a ramp over "
        "the first `cycle_ratio` of the cycle and then holds 1.",
    )
    anneal_start: float = Field(
        0.0, ge=0, le=1, allow_inf_nan=False, description="The factor at step 0 of a ramp."
    )
    warmup_steps: int = Field(1000, ge=1, description="Length of the linear ramp, in steps.")
    cycle_steps: int = Field(1000, ge=1, description="Length of one cyclical period, in steps.")
    cycle_ratio: float = Field(
        0.5, gt=0, le=1, allow_inf_nan=False, description="Fraction of a cycle spent ramping up."
    )


class BagOfWordsOptions(BaseModel):
    """Options of the kgCVAE bag-of-words auxiliary loss."""

    model_config = ConfigDict(extra="forbid")
    reduction: Literal["mean", "sum"] = Field(
        "mean",
        description="Per example, 'mean' averages -log p_bow(y_t) over active tokens (the scale of "
        "the uniform reconstruction); 'sum' adds them up as Zhao et al. (2017) do.",
    )


TermFunction = Callable[[LossInputs, TermContext, Any], torch.Tensor]


@dataclass(frozen=True)
class TermDefinition:
    """A registered loss term.

    Attributes:
        name: the key used in loss-stack specs.
        summary: one line for people (shown by ``GET /objectives``).
        options_model: pydantic model of the term's options (unknown options are rejected).
        compute: ``(inputs, context, options) -> scalar`` unweighted term value.
        weight_name: what the spec's weight means for this term (``beta`` for KL).
        needs: LossInputs fields beyond token_nll/base_nll/mask the term reads.
        needs_c_base: whether the stack must know c_base.
        weight_factor: optional ``(options, step) -> float`` schedule multiplying the weight.
    """

    name: str
    summary: str
    options_model: type[BaseModel]
    compute: TermFunction
    weight_name: str = "weight"
    needs: tuple[str, ...] = ()
    needs_c_base: bool = False
    weight_factor: Callable[[Any, int], float] | None = None

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


TERMS: dict[str, TermDefinition] = {}


def register_term(definition: TermDefinition) -> TermDefinition:
    """Add a term to the registry (names are unique)."""
    if definition.name in TERMS:
        raise ValueError(f"loss term {definition.name!r} is already registered")
    TERMS[definition.name] = definition
    return definition


def _batch_mean(per_example: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
    return masked_example_mean(per_example, inputs.mask)


def _uniform(inputs: LossInputs, context: TermContext, options: NoOptions) -> torch.Tensor:
    return _batch_mean(context.r_tok(inputs, 0.0), inputs)


def _normalized_uniform(inputs: LossInputs, context: TermContext, options: NoOptions) -> torch.Tensor:
    assert context.c_base is not None
    return _batch_mean(context.r_tok(inputs, 0.0), inputs) / context.c_base


def _token_weighted(inputs: LossInputs, context: TermContext, options: WeightingOptions) -> torch.Tensor:
    return _batch_mean(context.r_tok(inputs, options.alpha), inputs)


def _concentration_corrected(
    inputs: LossInputs, context: TermContext, options: WeightingOptions
) -> torch.Tensor:
    stats = context.stats(inputs, options.alpha)
    return _batch_mean(_divide_by_kappa(context.r_tok(inputs, options.alpha), stats), inputs)


def _normalized_concentration_corrected(
    inputs: LossInputs, context: TermContext, options: WeightingOptions
) -> torch.Tensor:
    assert context.c_base is not None
    stats = context.stats(inputs, options.alpha)
    r_tilde = _divide_by_kappa(context.r_tok(inputs, options.alpha), stats)
    return _batch_mean(r_tilde, inputs) / context.c_base


def kl_anneal_factor(options: KLOptions, step: int) -> float:
    """The schedule factor in [anneal_start, 1] that multiplies beta at ``step``."""
    if options.anneal == "none":
        return 1.0
    if options.anneal == "linear":
        progress = min(1.0, max(0, step) / options.warmup_steps)
    else:
        position = (max(0, step) % options.cycle_steps) / options.cycle_steps
        progress = min(1.0, position / options.cycle_ratio)
    return options.anneal_start + (1.0 - options.anneal_start) * progress


def _kl(inputs: LossInputs, context: TermContext, options: KLOptions) -> torch.Tensor:
    kl = inputs.kl
    assert kl is not None
    if kl.dim() not in (1, 2) or kl.shape[0] != inputs.mask.shape[0]:
        raise ValueError(
            f"kl must have shape [B] or [B, D] with B = {inputs.mask.shape[0]}, got {tuple(kl.shape)}"
        )
    per_dim = kl if kl.dim() == 2 else kl.unsqueeze(-1)
    has_active = inputs.mask.any(dim=-1)
    count = has_active.sum().clamp_min(1).to(per_dim.dtype)
    weights = has_active.to(per_dim.dtype) / count  # each example with an active token once
    free_bits = options.free_bits
    if options.free_bits_mode == "dimension":
        if kl.dim() != 2:
            raise ValueError(
                "kl must have shape [B, D] for free_bits_mode='dimension'; got shape "
                f"{tuple(kl.shape)} (use free_bits_mode='example' for per-example KL)"
            )
        per_dimension_mean = (weights.unsqueeze(-1) * per_dim).sum(dim=0)
        return per_dimension_mean.clamp_min(free_bits).sum() if free_bits else per_dimension_mean.sum()
    per_example = per_dim.sum(dim=-1)
    if free_bits:
        per_example = per_example.clamp_min(free_bits)
    return (weights * per_example).sum()


def _bag_of_words(inputs: LossInputs, context: TermContext, options: BagOfWordsOptions) -> torch.Tensor:
    logits, targets, mask = inputs.bow_logits, inputs.targets, inputs.mask
    assert logits is not None and targets is not None
    if logits.dim() != 2 or logits.shape[0] != mask.shape[0]:
        raise ValueError(f"bow_logits must have shape [B, V], got {tuple(logits.shape)}")
    if targets.shape != mask.shape:
        raise ValueError(
            f"targets must have the shape of mask {tuple(mask.shape)}, got {tuple(targets.shape)}"
        )
    # At least float32 (bf16 logits under autocast), but keep float64 when given.
    log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    safe_targets = torch.where(mask, targets, 0)
    token_nll = torch.where(mask, -log_probs.gather(1, safe_targets), 0.0)
    per_example = token_nll.sum(dim=-1)
    if options.reduction == "mean":
        per_example = per_example / mask.sum(dim=-1).clamp_min(1).to(per_example.dtype)
    return masked_example_mean(per_example, mask)


register_term(TermDefinition(
    "uniform", "Uniform token mean of l per example (the ordinary reconstruction NLL).",
    NoOptions, _uniform,
))
register_term(TermDefinition(
    "normalized_uniform",
    "Uniform token mean of l divided by c_base: the alpha = 0 endpoint of the normalized family.",
    NoOptions, _normalized_uniform, needs_c_base=True,
))
register_term(TermDefinition(
    "token_weighted",
    "R_tok,alpha = sum_t pi_t l_t: raw tempered surprisal-share token weighting.",
    WeightingOptions, _token_weighted,
))
register_term(TermDefinition(
    "concentration_corrected",
    "R~ = R_tok / kappa_alpha: token weighting with the concentration inflation removed.",
    WeightingOptions, _concentration_corrected,
))
register_term(TermDefinition(
    "normalized_concentration_corrected",
    "R^ = R~ / c_base: concentration-corrected and in z-free-relative units (baseline mean 1).",
    WeightingOptions, _normalized_concentration_corrected, needs_c_base=True,
))
register_term(TermDefinition(
    "kl",
    "KL(q(z|x,y) || p(z|x)) with free bits and an optional annealing schedule on beta.",
    KLOptions, _kl, weight_name="beta", needs=("kl",), weight_factor=kl_anneal_factor,
))
register_term(TermDefinition(
    "bag_of_words",
    "kgCVAE bag-of-words loss: -log p_bow(y_t | z, x) over the active target tokens.",
    BagOfWordsOptions, _bag_of_words, needs=("bow_logits", "targets"),
))


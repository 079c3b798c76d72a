"""The registry of loss terms a loss stack may combine.

Each term is a named, documented function of the batch with a pydantic model
of its options. Terms are found only by name in this registry: nothing in a
user's spec is ever resolved as an import path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel

from objectives.options import BagOfWordsOptions, KLOptions, NoOptions, WeightingOptions
from objectives.schedules import kl_anneal_factor
from objectives.spec import TERM_INFO, TermDeclaration
from objectives.token_weighting import (
    TokenWeightStats,
    divide_by_kappa,
    masked_example_mean,
    r_tok_from_stats,
    weight_stats_unchecked,
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
        posterior_probs: ``[B, C]`` q(z | x, y) of a discrete latent (needed by ``kl`` with
            ``mutual_info_credit > 0``).
        step: the global optimisation step, for KL annealing schedules (a Python int).
        kl_weight: the target-rate control's multiplier (a 0-d tensor, objectives/rate_control.py):
            the ``kl`` term's weight in place of its configured one wherever that is not 0
            (autoencoder pre-training keeps the KL off). None: the configured weight.
    """

    token_nll: torch.Tensor
    base_nll: torch.Tensor
    mask: torch.Tensor
    kl: torch.Tensor | None = None
    bow_logits: torch.Tensor | None = None
    targets: torch.Tensor | None = None
    posterior_probs: torch.Tensor | None = None
    step: int = 0
    kl_weight: torch.Tensor | None = None


@dataclass
class TermContext:
    """Stack-level settings shared by the terms of one call, with per-alpha caches.

    Terms at the same alpha share one computation of the weights and of R_tok.
    """

    alpha: float
    c_base: float | None
    train_kappa: Mapping[float, float] = field(default_factory=dict)  # alpha -> train mean kappa
    _stats: dict[float, TokenWeightStats] = field(default_factory=dict)
    _r_tok: dict[float, torch.Tensor] = field(default_factory=dict)

    def stats(self, inputs: LossInputs, alpha: float | None = None) -> TokenWeightStats:
        """Token-weight statistics at ``alpha`` (default the stack's) in the working dtype."""
        key = self.alpha if alpha is None else alpha
        if key not in self._stats:
            dtype = working_dtype(inputs.token_nll, inputs.base_nll)
            self._stats[key] = weight_stats_unchecked(inputs.base_nll, inputs.mask, key, dtype)
        return self._stats[key]

    def r_tok(self, inputs: LossInputs, alpha: float | None = None) -> torch.Tensor:
        """Per-example R_tok at ``alpha`` (default the stack's), ``[B]``."""
        key = self.alpha if alpha is None else alpha
        if key not in self._r_tok:
            self._r_tok[key] = r_tok_from_stats(inputs.token_nll, inputs.mask, self.stats(inputs, key))
        return self._r_tok[key]

    def cached_stats(self, alpha: float | None = None) -> TokenWeightStats | None:
        """The statistics at ``alpha`` (default the stack's) if a term of this call computed
        them, else None (no term weighs tokens)."""
        return self._stats.get(self.alpha if alpha is None else alpha)


TermFunction = Callable[[LossInputs, TermContext, Any], torch.Tensor]


@dataclass(frozen=True)
class TermDefinition:
    """A registered loss term: its description (:class:`~objectives.spec.TermDeclaration`) and its
    torch function.

    Attributes:
        name, summary, options_model, weight_name, needs, needs_c_base: as in ``TermDeclaration``.
        compute: ``(inputs, context, options) -> scalar`` unweighted term value.
        weight_factor: optional ``(options, step, total_steps) -> float`` schedule multiplying
            the weight (``total_steps``: the run's, for lengths relative to it; may be None).
    """

    name: str
    summary: str
    options_model: type[BaseModel]
    compute: TermFunction
    weight_name: str = "weight"
    needs: tuple[str, ...] = ()
    needs_c_base: bool = False
    weight_factor: Callable[[Any, int, int | None], float] | None = None

    @classmethod
    def from_info(cls, info: TermDeclaration, compute: TermFunction,
                  weight_factor: Callable[[Any, int, int | None], float] | None = None) -> TermDefinition:
        """The definition of a described term."""
        return cls(info.name, info.summary, info.options_model, compute, info.weight_name,
                   info.needs, info.needs_c_base, weight_factor)

    @property
    def info(self) -> TermDeclaration:
        """The torch-free description of the term."""
        return TermDeclaration(self.name, self.summary, self.options_model, self.weight_name,
                               self.needs, self.needs_c_base)

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable description: name, summary, weight meaning, inputs, options schema."""
        return self.info.describe()


TERMS: dict[str, TermDefinition] = {}


def register_term(definition: TermDefinition) -> TermDefinition:
    """Add a term to the registry (names are unique); specs may then name it."""
    if definition.name in TERMS:
        raise ValueError(f"loss term {definition.name!r} is already registered")
    TERMS[definition.name] = definition
    TERM_INFO.setdefault(definition.name, definition.info)
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
    return _batch_mean(divide_by_kappa(context.r_tok(inputs, options.alpha), stats), inputs)


def _train_kappa_corrected(inputs: LossInputs, context: TermContext, options: WeightingOptions) -> torch.Tensor:
    alpha = context.alpha if options.alpha is None else options.alpha
    return _batch_mean(context.r_tok(inputs, options.alpha), inputs) / context.train_kappa[float(alpha)]


def _normalized_concentration_corrected(
    inputs: LossInputs, context: TermContext, options: WeightingOptions
) -> torch.Tensor:
    assert context.c_base is not None
    stats = context.stats(inputs, options.alpha)
    r_tilde = divide_by_kappa(context.r_tok(inputs, options.alpha), stats)
    return _batch_mean(r_tilde, inputs) / context.c_base


def _kl(inputs: LossInputs, context: TermContext, options: KLOptions) -> torch.Tensor:
    kl = inputs.kl
    assert kl is not None
    if kl.dim() not in (1, 2) or kl.shape[0] != inputs.mask.shape[0]:
        raise ValueError(
            f"kl must have shape [B] or [B, D] with B = {inputs.mask.shape[0]}, got {tuple(kl.shape)}"
        )
    has_active = inputs.mask.any(dim=-1)
    # Rows without an active token count for nothing, whatever their KL (no NaN leaks in).
    per_dim = torch.where(has_active.unsqueeze(-1), kl if kl.dim() == 2 else kl.unsqueeze(-1), 0.0)
    count = has_active.sum().clamp_min(1).to(per_dim.dtype)
    once = has_active.to(per_dim.dtype) / count  # each example with an active token once
    weights = once
    if options.scale == "token":  # each example's KL per active target token (docs: KL units)
        weights = once / inputs.mask.sum(dim=-1).clamp_min(1).to(per_dim.dtype)
    free_bits = options.free_bits
    if options.free_bits_mode == "dimension":
        if kl.dim() != 2:
            raise ValueError(
                "kl must have shape [B, D] for free_bits_mode='dimension'; got shape "
                f"{tuple(kl.shape)} (use free_bits_mode='example' for per-example KL)"
            )
        per_dimension_mean = (weights.unsqueeze(-1) * per_dim).sum(dim=0)
        if not free_bits:
            return per_dimension_mean.sum()
        # Per token, the floor is lambda on the same 1/n-weighted mean: lambda * mean_b 1/n_b.
        floor = free_bits * weights.sum() if options.scale == "token" else free_bits
        return per_dimension_mean.clamp_min(floor).sum()
    per_example = per_dim.sum(dim=-1)
    if free_bits:
        per_example = per_example.clamp_min(free_bits)  # nats per example, before any 1/n
    value = (weights * per_example).sum()
    if options.mutual_info_credit:
        # The credit is each example's share KL(q_b || mean q) of I, on the KL's own scale.
        value = value - options.mutual_info_credit * batch_mutual_information(
            inputs, once, weights if options.scale == "token" else None)
    return value


def batch_mutual_information(inputs: LossInputs, weights: torch.Tensor,
                             shares: torch.Tensor | None = None) -> torch.Tensor:
    """I(x; z) of the batch under q: ``H(sum_b w_b q_b) - sum_b w_b H(q_b)`` (``weights``: each
    example with an active token once), differentiable; the plug-in estimate of a discrete latent.

    ``shares``: weigh each example's part of it, KL(q_b || sum_c w_c q_c) (whose ``weights``-mean
    is I), by ``shares`` instead (the per-token KL passes ``weights / n_b``).
    """
    probs = inputs.posterior_probs
    if probs is None:
        raise ValueError("kl option mutual_info_credit needs LossInputs.posterior_probs, the posterior "
                         "of a discrete latent (model.family: discrete); set it to 0 otherwise")
    if probs.dim() != 2 or probs.shape[0] != weights.shape[0]:
        raise ValueError(f"posterior_probs must have shape [B, C] with B = {weights.shape[0]}, "
                         f"got {tuple(probs.shape)}")
    # Rows of weight 0 (no active token) count for nothing, whatever their posterior.
    probs = torch.where((weights > 0).unsqueeze(-1), probs.to(weights.dtype), 1.0 / probs.shape[-1])
    aggregate = (weights.unsqueeze(-1) * probs).sum(dim=0)
    if shares is None:
        return _entropy(aggregate) - (weights * _entropy(probs)).sum()
    cross = -(probs * aggregate.clamp_min(torch.finfo(probs.dtype).tiny).log()).sum(dim=-1)
    return (shares * (cross - _entropy(probs))).sum()


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy over the last axis; a probability of exactly 0 adds 0 with a finite gradient
    (xlogy's gradient there is NaN)."""
    return -(probs * probs.clamp_min(torch.finfo(probs.dtype).tiny).log()).sum(dim=-1)


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


_COMPUTE: dict[str, tuple[TermFunction, Callable[[Any, int, int | None], float] | None]] = {
    "uniform": (_uniform, None),
    "normalized_uniform": (_normalized_uniform, None),
    "token_weighted": (_token_weighted, None),
    "concentration_corrected": (_concentration_corrected, None),
    "train_kappa_corrected": (_train_kappa_corrected, None),
    "normalized_concentration_corrected": (_normalized_concentration_corrected, None),
    "kl": (_kl, kl_anneal_factor),
    "bag_of_words": (_bag_of_words, None),
}
for _name, (_compute, _factor) in _COMPUTE.items():
    register_term(TermDefinition.from_info(TERM_INFO[_name], _compute, _factor))

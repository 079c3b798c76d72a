"""A stack's KL weight in common units: effective beta and beta in ELBO units.

Every reconstruction term is a per-token mean (the token weights sum to 1), while the KL is
per example. Two rescalings make a beta comparable across stacks and datasets:

- **effective beta** = beta / S, with S the reconstruction's weight on the raw nats scale
  (``sum_k w_k``, each normalized term's weight divided by c_base): Adam is invariant to a
  loss's overall scale, so a stack divided by c_base at beta trains like the undivided one
  at beta * c_base;
- **beta in ELBO units**: the weight of the KL against the *summed* token NLL, as in the
  ELBO (sum_t l_t + KL). With the KL per example (``scale: example``) it is effective beta
  x the train split's mean target length (exact when every target has that length); with
  the KL per target token (``scale: token``) it is effective beta itself, per example.

Torch-free: the planner, the report and the trainer use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from objectives.options import KLOptions
from objectives.spec import TERM_INFO, LossStackSpec

__all__ = [
    "RECONSTRUCTION_TERMS",
    "ElboBeta",
    "effective_beta",
    "elbo_beta",
    "elbo_beta_before_c_base",
    "kl_scale",
    "kl_weight",
    "reconstruction_scale",
    "trained_kl_weight",
    "weight_is_effective",
]

RECONSTRUCTION_TERMS = frozenset({"uniform", "normalized_uniform", "token_weighted",
                                  "concentration_corrected", "train_kappa_corrected",
                                  "normalized_concentration_corrected"})
"""The terms linear in the token losses l_t (each a per-token weighted mean)."""


def kl_weight(stack: LossStackSpec) -> float | None:
    """The stack's beta (the kl term's weight), None without a kl term."""
    term = stack.resolved_terms().get("kl")
    return None if term is None else float(term.weight)


def weight_is_effective(stack: LossStackSpec) -> bool:
    """Whether the kl term's weight is effective beta (``weight_units: effective``)."""
    term = stack.resolved_terms().get("kl")
    return term is not None and KLOptions.model_validate(term.options).weight_units == "effective"


def trained_kl_weight(stack: LossStackSpec, c_base: float | None) -> float | None:
    """The beta the stack trains at: the kl weight, times S when it is effective beta."""
    beta = kl_weight(stack)
    if beta is None or not weight_is_effective(stack):
        return beta
    raw, normalized = _raw_and_normalized(stack)
    if not normalized:
        return beta * raw
    if c_base is None:
        raise ValueError("kl weight_units 'effective' on a stack divided by c_base needs c_base")
    return beta * (raw + normalized / c_base)


def kl_scale(stack: LossStackSpec) -> str | None:
    """The kl term's ``scale`` option ('example' or 'token'), None without a kl term."""
    term = stack.resolved_terms().get("kl")
    return None if term is None else KLOptions.model_validate(term.options).scale


def _raw_and_normalized(stack: LossStackSpec) -> tuple[float, float]:
    """The reconstruction weights on the raw scale and divided by c_base, summed apart."""
    raw = normalized = 0.0
    for name, term in stack.resolved_terms().items():
        if name in RECONSTRUCTION_TERMS:
            if TERM_INFO[name].needs_c_base:
                normalized += term.weight
            else:
                raw += term.weight
    return raw, normalized


def reconstruction_scale(stack: LossStackSpec, c_base: float) -> float:
    """S: the stack's reconstruction weight on the raw nats scale (see the module docstring)."""
    raw, normalized = _raw_and_normalized(stack)
    return raw + normalized / c_base


def effective_beta(stack: LossStackSpec, c_base: float) -> float | None:
    """``beta / S``: the KL weight of the undivided stack that trains like this one.

    None when the stack has no kl term or no reconstruction term.
    """
    beta = kl_weight(stack)
    scale = reconstruction_scale(stack, c_base)
    if beta is None or scale <= 0:
        return None
    if weight_is_effective(stack):
        return beta
    return beta / scale


def elbo_beta(stack: LossStackSpec, c_base: float, mean_target_length: float) -> float | None:
    """Beta in ELBO units: effective beta x ``mean_target_length`` (the train split's mean
    number of active target tokens) under the per-example KL, effective beta under the
    per-token KL. None when the stack has no kl or no reconstruction term."""
    effective = effective_beta(stack, c_base)
    if effective is None:
        return None
    return effective * (mean_target_length if kl_scale(stack) == "example" else 1.0)


@dataclass(frozen=True)
class ElboBeta:
    """Beta in ELBO units before c_base is known: a number, a multiple of c_base, or unknown.

    Attributes:
        value: the number, when it needs no c_base (no normalized term).
        per_c_base: the factor of c_base, when every reconstruction term is divided by it.
        unknown: why there is no number yet (None when ``value`` or ``per_c_base`` is set).
    """

    value: float | None = None
    per_c_base: float | None = None
    unknown: str | None = None

    def describe(self) -> str:
        """``21``, ``21 x c_base`` or ``unknown (why)``."""
        if self.value is not None:
            return f"{self.value:.3g}"
        if self.per_c_base is not None:
            return f"{self.per_c_base:.3g} x c_base"
        return f"unknown ({self.unknown})"


def elbo_beta_before_c_base(stack: LossStackSpec, mean_target_length: float | None,
                            length_unknown: str = "the mean target length is not known"
                            ) -> ElboBeta:
    """:func:`elbo_beta` as far as it is known before the trial measures c_base.

    ``mean_target_length`` None (with ``length_unknown`` saying why) matters only under the
    per-example KL. A stack mixing raw and normalized reconstruction terms has no number
    without c_base (S = raw + normalized / c_base).
    """
    beta = kl_weight(stack)
    raw, normalized = _raw_and_normalized(stack)
    if beta is None:
        return ElboBeta(unknown="the stack has no kl term")
    if raw + normalized <= 0:
        return ElboBeta(unknown="the stack has no reconstruction term")
    length = 1.0
    if kl_scale(stack) == "example":
        if mean_target_length is None:
            return ElboBeta(unknown=length_unknown)
        length = mean_target_length
    if weight_is_effective(stack):
        return ElboBeta(value=beta * length)
    if normalized == 0:
        return ElboBeta(value=beta * length / raw)
    if raw == 0:
        return ElboBeta(per_c_base=beta * length / normalized)
    return ElboBeta(unknown="needs c_base, measured when the trial runs: the stack mixes raw "
                    "and normalized terms")

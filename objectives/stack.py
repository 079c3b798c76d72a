"""Loss stacks: the callable built from a declarative :class:`~objectives.spec.LossStackSpec`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from objectives._checks import check_c_base, check_pair, check_token_nll
from objectives.options import KLOptions
from objectives.rate_control import RateControl
from objectives.spec import (
    PRESETS,
    TERM_INFO,
    LossStackSpec,
    TermSpec,
    describe_presets,
    preset_spec,
)
from objectives.terms import TERMS, LossInputs, TermContext
from objectives.token_weighting import TokenWeightStats
from objectives.units import trained_kl_weight

__all__ = [
    "TermSpec",
    "LossStackSpec",
    "LossStack",
    "LossOutput",
    "PRESETS",
    "preset_spec",
    "describe_presets",
]


@dataclass
class LossOutput:
    """The result of one stack call.

    Attributes:
        total: scalar ``sum_k weight_k * factor_k(step) * value_k`` (the training loss; the kl
            term's weight is ``LossInputs.kl_weight`` under a target-rate control).
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

    ``total_steps``: the trial's whole run in optimizer steps, which schedules given relative
    to the run (``warmup_fraction``, ``cycles``) resolve against.

    Raises (at construction):
        ValueError: a normalized term without a positive c_base; a run-relative schedule
            without ``total_steps``.
    """

    def __init__(self, spec: LossStackSpec, c_base: float | None = None,
                 train_kappa: Mapping[float, float] | None = None,
                 total_steps: int | None = None) -> None:
        self.spec = spec
        self.alpha = spec.alpha
        self.total_steps = total_steps
        if spec.needs_train_kappa:
            missing = sorted(spec.term_alphas() - set(train_kappa or {}))
            if missing:
                raise ValueError(
                    "the train split's mean kappa is required by the terms of this stack "
                    f"({', '.join(n for n in spec.resolved_terms() if TERM_INFO[n].needs_train_kappa)}) "
                    f"at alpha {', '.join(f'{a:g}' for a in missing)}; measure it with "
                    "KappaSummaryAccumulator on the train split and pass build(train_kappa={alpha: mean})")
            bad = {a: k for a, k in (train_kappa or {}).items() if not (math.isfinite(k) and k >= 1.0 - 1e-9)}
            if bad:
                raise ValueError(f"train_kappa must be finite means of kappa (>= 1), got {bad}")
        self.train_kappa = dict(train_kappa or {})
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
        trained_beta = trained_kl_weight(spec, chosen)  # effective beta turned into beta here
        self._terms = [
            (name, TERMS[name], trained_beta if name == "kl" and trained_beta is not None else term.weight,
             TERMS[name].options_model.model_validate(term.options))
            for name, term in spec.resolved_terms().items()
        ]
        for name, _, _, options in self._terms:
            if getattr(options, "relative", False) and total_steps is None:
                raise ValueError(
                    f"loss term {name!r} has a schedule relative to the run (warmup_fraction or "
                    "cycles): build the stack with total_steps=... (the trial's optimizer steps)")

    def rate_control(self, device: torch.device | str = "cpu") -> RateControl | None:
        """A fresh target-rate control of the stack's kl term, starting at its trained weight
        (objectives/rate_control.py); None without a kl term or a ``target_rate``."""
        for name, _, weight, options in self._terms:
            if name == "kl" and isinstance(options, KLOptions):
                return RateControl.create(options, weight, device)
        return None

    def kl_on(self, step: int) -> bool:
        """Whether the kl term is weighed at ``step`` (not before autoencoder pre-training ends):
        when the target-rate control may move."""
        return self.weights_at(step).get("kl", 0.0) != 0.0

    @property
    def term_names(self) -> list[str]:
        """Names of the terms, in evaluation order."""
        return [name for name, *_ in self._terms]

    def weights_at(self, step: int) -> dict[str, float]:
        """Each term's effective weight at ``step`` (its weight times its schedule factor)."""
        return {name: weight * (definition.weight_factor(options, step, self.total_steps)
                                if definition.weight_factor else 1.0)
                for name, definition, weight, options in self._terms}

    def __call__(self, inputs: LossInputs) -> LossOutput:
        check_pair(inputs.base_nll, inputs.mask)
        check_token_nll(inputs.token_nll, inputs.base_nll)
        context = TermContext(alpha=self.alpha, c_base=self.c_base, train_kappa=self.train_kappa)
        values: dict[str, torch.Tensor] = {}
        weights = self.weights_at(inputs.step)
        total = torch.zeros((), dtype=inputs.token_nll.dtype, device=inputs.token_nll.device)
        for name, definition, _, options in self._terms:
            for needed in definition.needs:
                if getattr(inputs, needed) is None:
                    raise ValueError(f"loss term {name!r} needs LossInputs.{needed}, which is None")
            value = definition.compute(inputs, context, options)
            values[name] = value
            if weights[name] != 0.0:
                weight = (inputs.kl_weight.to(total.dtype) if name == "kl" and inputs.kl_weight is not None
                          else weights[name])
                total = total + weight * value.to(total.dtype)
        return LossOutput(total, values, weights, context.cached_stats(self.alpha))

"""A trial's configuration from its params: the spec's template with one point of the axes.

:class:`TrialConfigs` holds only what that takes (the template, the swept models, the loss
stacks and the common terms). The driver hands it to every Tune trial in place of the whole
spec, so a trial builds its own configuration without parsing and validating the spec again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from objectives.spec import LossStackSpec, TermSpec
from workers.models.config import ModelConfig
from workers.train.config import TrialConfig

__all__ = ["TrialConfigs"]


@dataclass(frozen=True)
class TrialConfigs:
    """The trial configurations of one sweep, built on demand from a trial's params."""

    template: TrialConfig
    models: tuple[str, ...]
    loss_stacks: tuple[str | LossStackSpec, ...]
    common_terms: Mapping[str, TermSpec]

    def stack_labels(self) -> list[str]:
        """The label of each loss stack, in spec order (the ``loss_stack`` param of a trial)."""
        return [s if isinstance(s, str) else str(s.name) for s in self.loss_stacks]

    def stack_spec(self, label: str, alpha: float, beta: float | None = None,
                   free_bits: float | None = None, target_rate: float | None = None
                   ) -> LossStackSpec:
        """The stack called ``label`` at ``alpha``, with the common terms it lacks merged in,
        and ``beta``/``free_bits``/``target_rate`` (when given) applied to its kl term.

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
        swept = (beta, free_bits, target_rate)
        if any(value is not None for value in swept) and "kl" in {**own, **terms}:
            kl = {**own, **terms}["kl"]
            options = dict(kl.options)
            if free_bits is not None:
                options["free_bits"] = float(free_bits)
            if target_rate is not None:
                options["target_rate"] = float(target_rate)
            terms["kl"] = TermSpec(weight=kl.weight if beta is None else float(beta),
                                   options=options)
        return LossStackSpec(name=label, preset=base.preset, alpha=alpha, terms=terms)

    def trial_config(self, alpha: float, loss_stack: str, model: str, seed: int,
                     beta: float | None = None, free_bits: float | None = None,
                     target_rate: float | None = None) -> TrialConfig:
        """The template with one point of the axes applied (and a run name that says which).

        Raises:
            KeyError: unknown stack label. ValueError: a model family not in ``models``.
        """
        if model not in self.models:
            raise ValueError(f"model {model!r} is not swept; models: {', '.join(self.models)}")
        stack = self.stack_spec(loss_stack, alpha, beta, free_bits, target_rate)
        family = ModelConfig.model_validate({**self.template.model.model_dump(), "family": model})
        name = f"{model}-{loss_stack}-a{alpha:g}"
        name += "" if beta is None else f"-b{beta:g}"
        name += "" if free_bits is None else f"-fb{free_bits:g}"
        name += "" if target_rate is None else f"-r{target_rate:g}"
        return TrialConfig.model_validate(
            {**dict(self.template), "name": f"{name}-s{seed}", "seed": seed, "model": family,
             "loss_stack": stack}
        )

    def trial_config_for(self, params: Mapping[str, Any]) -> TrialConfig:
        """:meth:`trial_config` from a trial's params (Tune's config: alpha, loss_stack, model,
        seed, and beta/free_bits/target_rate when swept)."""
        optional = {key: None if params.get(key) is None else float(params[key])
                    for key in ("beta", "free_bits", "target_rate")}
        return self.trial_config(float(params["alpha"]), str(params["loss_stack"]),
                                 str(params["model"]), int(params["seed"]), **optional)

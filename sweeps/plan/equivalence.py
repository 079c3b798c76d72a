"""When two trials train the same objective: objective equivalence, which merges them (dedup).

Two trials with the same template, model, seed and canonical objective signature
(:func:`objective_signature`) compute the same loss at every step, so they are one trial. The
KL weight's common units (effective beta, beta in ELBO units) are :mod:`objectives.units`'.
"""

from __future__ import annotations

import json

from objectives.spec import TERM_INFO, LossStackSpec

__all__ = ["UNIFORM_TWIN", "objective_signature"]

UNIFORM_TWIN = {
    "token_weighted": "uniform",
    "concentration_corrected": "uniform",
    "train_kappa_corrected": "uniform",
    "normalized_concentration_corrected": "normalized_uniform",
}
"""Weighting term -> the term it equals at alpha 0."""


def _canonical_terms(stack: LossStackSpec) -> dict[tuple[str, str], float]:
    merged: dict[tuple[str, str], float] = {}
    for name, term in stack.resolved_terms().items():
        if term.weight == 0:
            continue
        options = TERM_INFO[name].options_model.model_validate(term.options).model_dump(mode="json")
        if name in UNIFORM_TWIN:
            alpha = options.pop("alpha", None)
            alpha = stack.alpha if alpha is None else alpha
            if alpha == 0:
                name = UNIFORM_TWIN[name]
            else:
                options = {"alpha": float(alpha)}
        key = (name, json.dumps(options, sort_keys=True))
        merged[key] = merged.get(key, 0.0) + float(term.weight)
    return merged


def objective_signature(stack: LossStackSpec) -> str:
    """A canonical text of the objective ``stack`` trains: equal text, equal objective.

    The stack's terms with weights and resolved options, after three rewrites that are
    identities of the objective library:

    - a weighting term at alpha 0 is its uniform twin (pi_t = 1/T, kappa = 1):
      ``token_weighted``, ``concentration_corrected`` and ``train_kappa_corrected`` become
      ``uniform``, ``normalized_concentration_corrected`` becomes ``normalized_uniform``;
    - alpha is kept only on terms that still depend on it (a term's own ``alpha`` option
      overrides the stack's), so ``uniform`` is one objective at every alpha;
    - terms of weight 0 (computed and reported, never trained on) are dropped, and terms that
      coincide after the rewrites are merged by adding their weights.

    The kl term's options enter whole, its ``scale`` among them (the KL per example and per
    target token are two objectives), and a schedule in steps is kept apart from the same one
    relative to the run (their step counts are known only when the trial runs). What the
    signature does not see: the diagnostics a trial logs at its own alpha (the kappa
    statistics); a shared trial reports them at the alpha of its representative row.

    The stack's label and preset do not enter; alpha enters only through the terms that
    depend on it. Examples: ``uniform`` at alpha 0 and at alpha 2 give the same signature;
    so do ``raw_token_weighted`` at alpha 0 and ``uniform``; ``ncc`` at alpha 0 and
    ``normalized_uniform``.
    """
    items = sorted((name, options, weight) for (name, options), weight in
                   _canonical_terms(stack).items())
    return json.dumps(items, separators=(",", ":"))

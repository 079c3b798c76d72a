"""When two trials train the same objective, and at which effective beta a stack trains.

Objective equivalence (dedup). Two trials with the same template, model, seed and
*canonical objective signature* compute the same loss at every step, so they are one
trial. The signature of a stack at alpha is its terms with weights and resolved options,
after three rewrites that are identities of the objective library:

- a weighting term at alpha 0 is its uniform twin: pi_t = 1/T and kappa = 1, so
  ``token_weighted``, ``concentration_corrected`` and ``train_kappa_corrected`` become ``uniform`` and
  ``normalized_concentration_corrected`` becomes ``normalized_uniform``;
- alpha is kept only on terms that still depend on it (a term's own ``alpha`` option
  overrides the stack's), so ``uniform`` is one objective at every alpha;
- terms of weight 0 (computed and reported, never trained on) are dropped, and terms that
  coincide after the rewrites are merged by adding their weights.

What the signature does not see: the diagnostics a trial logs at its own alpha (the
kappa statistics). A shared trial reports them at the alpha of its representative row.

Effective beta. Adam is invariant to a loss's overall scale, so a stack whose
reconstruction is divided by c_base at KL weight beta trains like the undivided stack at
beta * c_base. For any stack we define the reconstruction scale on the raw (nats) scale

    S = sum over reconstruction terms k of  w_k * (1 / c_base if term k is normalized else 1)

and ``effective beta = beta / S``: beta for ``uniform``, ``raw_token_weighted`` and
``concentration_corrected`` (S = 1), beta * c_base for ``ncc`` and
``normalized_uniform`` (S = 1 / c_base), and beta / (1 + 1 / c_base) for
``raw_plus_ncc``. At the z-free baseline every reconstruction term has mean b_u on the
raw scale (mean R~ = mean b_u, mean R^ = 1), which is what makes S the right common unit.
Auxiliary terms (``bag_of_words``) are not reconstruction and do not enter S.
"""

from __future__ import annotations

import json

from objectives.spec import TERM_INFO as TERMS
from objectives.spec import LossStackSpec

__all__ = [
    "RECONSTRUCTION_TERMS",
    "UNIFORM_TWIN",
    "effective_beta",
    "kl_weight",
    "objective_signature",
    "reconstruction_scale",
]

UNIFORM_TWIN = {
    "token_weighted": "uniform",
    "concentration_corrected": "uniform",
    "train_kappa_corrected": "uniform",
    "normalized_concentration_corrected": "normalized_uniform",
}
"""Weighting term -> the term it equals at alpha 0."""

RECONSTRUCTION_TERMS = frozenset({"uniform", "normalized_uniform", *UNIFORM_TWIN})


def _canonical_terms(stack: LossStackSpec) -> dict[tuple[str, str], float]:
    merged: dict[tuple[str, str], float] = {}
    for name, term in stack.resolved_terms().items():
        if term.weight == 0:
            continue
        options = TERMS[name].options_model.model_validate(term.options).model_dump(mode="json")
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

    The stack's label and preset do not enter; alpha enters only through the terms that
    depend on it. Examples: ``uniform`` at alpha 0 and at alpha 2 give the same signature;
    so do ``raw_token_weighted`` at alpha 0 and ``uniform``; ``ncc`` at alpha 0 and
    ``normalized_uniform``.
    """
    items = sorted((name, options, weight) for (name, options), weight in
                   _canonical_terms(stack).items())
    return json.dumps(items, separators=(",", ":"))


def kl_weight(stack: LossStackSpec) -> float | None:
    """The stack's beta (the kl term's weight), None without a kl term."""
    term = stack.resolved_terms().get("kl")
    return None if term is None else float(term.weight)


def reconstruction_scale(stack: LossStackSpec, c_base: float) -> float:
    """S: the stack's reconstruction weight on the raw nats scale (see the module docstring)."""
    scale = 0.0
    for name, term in stack.resolved_terms().items():
        if name in RECONSTRUCTION_TERMS:
            scale += term.weight / c_base if TERMS[name].needs_c_base else term.weight
    return scale


def effective_beta(stack: LossStackSpec, c_base: float) -> float | None:
    """``beta / S``: the KL weight of the undivided stack that trains like this one.

    None when the stack has no kl term or no reconstruction term.
    """
    beta = kl_weight(stack)
    scale = reconstruction_scale(stack, c_base)
    if beta is None or scale <= 0:
        return None
    return beta / scale

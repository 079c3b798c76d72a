"""Where the latent's learning signal comes from: the gradient shares of token groups.

The signal z gets from reconstruction is the gradient of the stack's reconstruction part R
(its terms linear in the token losses l_t; KL and bag-of-words left out) with respect to the
posterior q(z | x, y)'s parameters, reached only through z. R is linear in l, so a token
group's part of R is R on its masked losses, and its share of the update direction is a
projection (:func:`gradient_shares`; the groups: :func:`token_groups`). Computed at epoch end
on a fixed evaluation batch in eval mode: no RNG is consumed, so read-outs never change training.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from objectives import LossInputs, LossStackSpec
from workers.data import KINDS
from workers.models.cvae import INFERENCE_PARAMS

# q(z | x, y)'s own parameters, by name in the model: the target encoder's and the posterior
# head's. The token embedding the encoders share with the decoder is the model's
# ``embedding.*`` (named once, where first registered), so it is left out.
POSTERIOR_PARAMS = INFERENCE_PARAMS

LINEAR_TERMS = ("uniform", "normalized_uniform", "token_weighted", "concentration_corrected",
                "train_kappa_corrected", "normalized_concentration_corrected")


def posterior_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the shares are measured on (:data:`POSTERIOR_PARAMS`)."""
    return [p for name, p in model.named_parameters() if name.startswith(POSTERIOR_PARAMS)]


def reconstruction_spec(spec: LossStackSpec) -> LossStackSpec | None:
    """The stack's terms that are linear in l_t (same weights, options, alpha); None if none."""
    terms = {name: term for name, term in spec.resolved_terms().items()
             if name in LINEAR_TERMS and term.weight != 0}
    if not terms:
        return None
    return LossStackSpec(alpha=spec.alpha, terms=terms)


def token_groups(
    base_nll: torch.Tensor, cond_nll: torch.Tensor | None, mask: torch.Tensor, kind: torch.Tensor,
    prefix_length: torch.Tensor | None, kinds: tuple[str, ...] = KINDS,
) -> dict[str, torch.Tensor]:
    """The ``[B, T]`` token-group memberships a_G in [0, 1] (0 off ``mask``).

    ``prefix``: t below the example's prefix length (the complement is the body);
    ``top_decile_b``: b_t at or above the 90th percentile of the batch's active tokens;
    ``explained``: soft, each token's loss split in proportion to its surprisal, membership
    ``e_t = clamp((b_t - h_t) / b_t, 0, 1)`` (0 where b_t = 0) for the strategy-explained part
    and ``1 - e_t`` for the unexplained h_t part (a prefix token with b = log(K m), h = log m
    counts log K / log(K m) explained); ``kind_{kind}``: all tokens of one kind's examples.
    Without an oracle (a dataset: ``cond_nll`` and ``prefix_length`` None) the ``prefix``
    and ``explained`` groups are absent; ``kinds`` names the kind codes (a dataset's groups).
    """
    positions = torch.arange(mask.shape[1], device=mask.device)[None, :]
    active_b = base_nll[mask]
    cutoff = torch.quantile(active_b.double(), 0.9) if active_b.numel() else torch.tensor(math.inf)
    groups: dict[str, torch.Tensor] = {}
    if prefix_length is not None:
        groups["prefix"] = mask & (positions < prefix_length[:, None])
    groups["top_decile_b"] = mask & (base_nll.double() >= cutoff.to(base_nll.device))
    if cond_nll is not None:
        b = base_nll.double()
        explained = torch.where(b > 0, (b - cond_nll.double()) / b.clamp_min(1e-30), 0.0).clamp(0, 1)
        groups["explained"] = torch.where(mask, explained, 0.0).to(base_nll.dtype)
    for index, name in enumerate(kinds):
        groups[f"kind_{name}"] = mask & (kind == index)[:, None]
    return groups


def settled_share(norm2: float, anything: bool, whole: bool) -> float | None:
    """A group's share when no backward pass is needed, else None: NaN when g = 0, 0 for a
    group without tokens, 1 for a group that is the whole batch."""
    if norm2 == 0.0:
        return math.nan
    if not anything:
        return 0.0
    return 1.0 if whole else None


def gradient_shares(
    token_nll_fn: Callable[[], torch.Tensor],
    parameters: Sequence[torch.nn.Parameter],
    recon_stack,
    base_nll: torch.Tensor,
    mask: torch.Tensor,
    groups: dict[str, torch.Tensor],
) -> dict[str, float]:
    """``{grad_share_{group}: share}`` plus ``grad_norm_encoder``.

    With ``g = dR/dtheta`` and ``g_G = dR_G/dtheta`` (one autograd.grad per group on one forward
    pass), ``grad_share_G = <g_G, g> / <g, g>``: the projection share of G in the update
    direction. The shares of a partition (memberships summing to 1 on every token) sum to 1
    exactly; a share can be negative (a group pulling against the rest) or above 1; NaN when
    g = 0. This is not the gradient with respect to l_t, which is w (pi) by construction. The
    parameters are the target encoder's and the posterior head's (both latent families and both
    discrete estimators have them); the shared token embedding is left out.

    Args:
        token_nll_fn: runs the forward pass with autograd on and returns ``[B, T]`` l_t.
        parameters: the parameters the shares are measured on (q(z|x,y)'s).
        recon_stack: the built stack of :func:`reconstruction_spec`.
    """
    params = [p for p in parameters if p.requires_grad]
    with torch.enable_grad():
        token_nll = token_nll_fn().float()

        def grad_of(values: torch.Tensor) -> list[torch.Tensor]:
            loss = recon_stack(LossInputs(values, base_nll, mask)).total
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]

        total = grad_of(token_nll)
        norm2 = sum(float((g.double() ** 2).sum()) for g in total)
        out = {"grad_norm_encoder": math.sqrt(norm2)}
        for name, group in groups.items():
            settled = settled_share(norm2, bool(group.any()),
                                    bool((group.to(token_nll.dtype) == mask.to(token_nll.dtype)).all()))
            if settled is not None:
                out[f"grad_share_{name}"] = settled
                continue
            part = grad_of(token_nll * group.to(token_nll.dtype))
            dot = sum(float((a.double() * b.double()).sum()) for a, b in zip(part, total, strict=True))
            out[f"grad_share_{name}"] = dot / norm2
    return out

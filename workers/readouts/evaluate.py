"""One evaluation pass of a model over a split, and the model-dependent read-outs.

:func:`collect` runs the model over a split in batches; :func:`model_readouts` turns its
outputs into the read-outs, overall and per kind (the names: its docstring). On a registered
dataset the kinds are its groups, and without a label column the latent-recovery read-outs
(NMI, ARI, I(z; s)) are absent: there is no s to recover.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from objectives import LossInputs, LossStackSpec, token_weight_stats
from workers.contract import ACTIVE_UNITS, KL, MUTUAL_INFO, USED_CATEGORIES
from workers.readouts import recovery
from workers.readouts.confounds import confound_readouts
from workers.readouts.latent import discrete_mi_zs, gaussian_mixture_mi_zs, kl_kappa_spearman
from workers.readouts.split_data import SplitData

DIAGNOSTIC_TERMS = {
    "recon_uniform": "uniform",
    "recon_token_weighted": "token_weighted",
    "recon_cc": "concentration_corrected",
    "recon_ncc": "normalized_concentration_corrected",
}


def diagnostic_stack(alpha: float, c_base: float):
    """Every reconstruction read-out as a weight-0 term of one stack (computed, not trained)."""
    return LossStackSpec(alpha=alpha, terms=dict.fromkeys(DIAGNOSTIC_TERMS.values(), 0.0)).build(
        c_base=c_base)


@dataclass
class Collected:
    """A model's outputs on every example of a split (``kl`` as the model returns it)."""

    token_nll: torch.Tensor
    kl: torch.Tensor
    bow_logits: torch.Tensor
    posterior_probs: torch.Tensor | None
    posterior_mean: torch.Tensor | None
    posterior_logvar: torch.Tensor | None

    @property
    def kl_per_example(self) -> torch.Tensor:
        return self.kl.sum(-1) if self.kl.dim() == 2 else self.kl


@torch.no_grad()
def collect(forward: Callable[[torch.Tensor], object], n: int, batch_size: int,
            device: torch.device) -> Collected:
    """Run ``forward(indices) -> CVAEOutput`` over rows 0..n-1 in batches and concatenate."""
    parts: dict[str, list[torch.Tensor]] = {}
    for indices in torch.arange(n).split(batch_size):
        output = forward(indices.to(device))
        for name in Collected.__dataclass_fields__:
            value = getattr(output, name)
            if value is not None:
                parts.setdefault(name, []).append(value.float())
    merged = {name: torch.cat(parts[name]) if name in parts else None
              for name in Collected.__dataclass_fields__}
    return Collected(**merged)


def _latent_labels(collected: Collected, num_strategies: int, seed: int) -> torch.Tensor:
    if collected.posterior_probs is not None:
        return collected.posterior_probs.argmax(-1).cpu()
    return recovery.kmeans_labels(collected.posterior_mean.cpu(), num_strategies, seed=seed)


def _group_readouts(collected: Collected, data: SplitData, rows: torch.Tensor, labels: torch.Tensor,
                    stack, diagnostics, step: int, num_strategies: int, seed: int,
                    sampled: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, float]:
    """The read-outs of the examples ``rows``; ``sampled``: their ``posterior_samples`` when drawn."""
    device_rows = rows.to(collected.token_nll.device)
    mask = data.split.mask[device_rows]
    token_nll, base = collected.token_nll[device_rows], data.base_nll[device_rows]
    out = {"loss": float(stack(LossInputs(
        token_nll, base, mask, kl=collected.kl[device_rows], bow_logits=collected.bow_logits[device_rows],
        targets=data.split.target[device_rows], step=step,
        posterior_probs=None if collected.posterior_probs is None else collected.posterior_probs[device_rows],
    )).total)}
    terms = diagnostics(LossInputs(token_nll, base, mask)).terms
    out.update({name: float(terms[term]) for name, term in DIAGNOSTIC_TERMS.items()})
    kl = collected.kl_per_example[device_rows].cpu()
    out[KL] = float(kl.mean())
    out["elbo"] = float(((token_nll.double() * mask).sum(-1).cpu() + kl.double()).mean())
    if collected.posterior_probs is None:
        mean = collected.posterior_mean[device_rows]
        out[ACTIVE_UNITS] = float(recovery.active_units_gaussian(mean))
    out["kl_kappa_spearman"] = kl_kappa_spearman(kl, data.kappa[rows])
    if not data.has_label:
        return out
    truth = data.split.strategy[device_rows].cpu()
    if truth.numel() > 0:
        out.update(recovery.latent_recovery(labels[rows], truth))
    if collected.posterior_probs is not None:
        out["mi_zs"] = discrete_mi_zs(collected.posterior_probs[device_rows], truth, num_strategies)
    else:
        out["mi_zs"] = gaussian_mixture_mi_zs(collected.posterior_mean[device_rows],
                                              collected.posterior_logvar[device_rows], truth, seed,
                                              sampled=sampled)
    return out


def model_readouts(collected: Collected, data: SplitData, stack, diagnostics, *, step: int,
                   num_strategies: int, seed: int, alpha: float) -> dict[str, float]:
    """Overall and per-kind model read-outs of one split.

    Names (``{name}`` overall, ``{kind}/{name}`` per kind; the caller prefixes the split):
    ``loss`` (the trial's stack), ``recon_uniform`` (mean l), ``recon_token_weighted`` (R_tok),
    ``recon_cc`` (R~), ``recon_ncc`` (R^), ``kl`` (the rate E[KL], summed over dimensions),
    ``latent_nmi`` / ``latent_ari`` (argmax q, or k-means on the posterior means with K = the
    number of strategies fitted on the whole split, against s), ``mi_zs`` (I(z; s), see
    ``latent.py``), ``kl_kappa_spearman``, and for the continuous family ``active_units``
    (dimensions whose posterior mean varies over the group's examples by more than 0.01, the
    diagonal of Cov_x(E_q[z|x]); Burda et al. 2016). Overall only: ``mutual_info`` (I(x; z) in
    nats: exact for the discrete family, a paired mixture estimate for the continuous one:
    ``workers.readouts.recovery``), for the discrete family ``active_units`` (Burda's definition on the
    one-hot coordinates: categories whose probability varies over x by more than 0.01) and
    ``used_categories`` (categories with aggregate mass >= 0.01, which a collapsed posterior
    fills); ``latent_ami`` and ``latent_nmi_shuffled`` (recovery beside its chance level:
    ``workers.readouts.recovery.chance_readouts``). ``elbo``: the mean over examples of ``sum_t l_t + KL``
    (the negative ELBO in nats, lower is better), the same for every stack, so stacks on
    different loss scales stay comparable.
    """
    labels = _latent_labels(collected, num_strategies, seed) if data.has_label else torch.zeros(0)
    everything = torch.arange(len(data.split))
    args = (stack, diagnostics, step, num_strategies, seed)
    # The whole split's posterior samples serve I(x; z) and its I(z; s): drawn once.
    sampled = (recovery.posterior_samples(collected.posterior_mean, collected.posterior_logvar, seed)
               if collected.posterior_probs is None and len(data.split) else None)
    out = _group_readouts(collected, data, everything, labels, *args, sampled=sampled)
    if data.has_label and len(data.split):
        out.update(recovery.chance_readouts(labels, data.split.strategy.cpu()))
        out.update(confound_readouts(labels, data.split.mask, data.kappa, data.split.strategy.cpu()))
    if alpha == 0:
        out["kl_kappa_spearman"] = math.nan
    kind = data.split.kind.cpu()
    for index, name in enumerate(data.kinds):
        rows = (kind == index).nonzero().flatten()
        if rows.numel():
            group = _group_readouts(collected, data, rows, labels, *args)
            out.update({f"{name}/{key}": value for key, value in group.items()})
    if collected.posterior_probs is not None:
        probs = collected.posterior_probs
        out[MUTUAL_INFO] = recovery.discrete_mutual_information(probs)
        out[ACTIVE_UNITS] = float(recovery.active_units_discrete(probs))
        out[USED_CATEGORIES] = float(recovery.used_categories(probs))
    else:
        out[MUTUAL_INFO] = recovery.gaussian_mutual_information(
            collected.posterior_mean, collected.posterior_logvar, seed=seed, sampled=sampled)
    return out


def position_profiles(collected: Collected, data: SplitData, alpha: float) -> dict[str, dict[str, list[float]]]:
    """Per kind, the mean over examples of l_t, b_t and pi_t at each target position t
    (positions where no example of the kind is active are NaN); a dataset without groups
    has one profile, ``all``."""
    mask = data.split.mask.cpu()
    values = {"l": collected.token_nll.double().cpu(), "b": data.base_nll.double().cpu(),
              "pi": token_weight_stats(data.base_nll.double().cpu(), mask, alpha).weights.double()}
    kind = data.split.kind.cpu()
    out: dict[str, dict[str, list[float]]] = {}
    for index, name in enumerate(data.kinds or ("all",)):
        rows = kind == index
        if not rows.any():
            continue
        count = mask[rows].sum(0).double()
        out[name] = {
            key: torch.where(count > 0, (tensor[rows] * mask[rows]).sum(0) / count.clamp_min(1),
                             math.nan).tolist()
            for key, tensor in values.items()
        }
    return out

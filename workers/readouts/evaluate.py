"""One evaluation pass of a model over a split, and the model-dependent read-outs.

Names (``{name}`` overall, ``{kind}/{name}`` per kind; the caller prefixes the split):
``loss`` (the trial's stack), ``recon_uniform`` (mean l), ``recon_token_weighted`` (R_tok),
``recon_cc`` (R~), ``recon_ncc`` (R^), ``kl`` (the rate E[KL], summed over dimensions),
``latent_nmi`` / ``latent_ari`` (argmax q, or k-means on the posterior means with K = the
number of strategies fitted on the whole split, against s), ``mi_zs`` (I(z; s), see
``latent.py``), ``kl_kappa_spearman``, and for the continuous family ``active_units``
(dimensions whose posterior mean varies over the group's examples by more than 0.01, the
diagonal of Cov_x(E_q[z|x]); Burda et al. 2016). Overall only: ``mutual_info`` (I(x; z) in
nats: exact for the discrete family, a paired mixture estimate for the continuous one:
``workers.metrics``), for the discrete family ``active_units`` (Burda's definition on the
one-hot coordinates: categories whose probability varies over x by more than 0.01) and
``used_categories`` (categories with aggregate mass >= 0.01, which a collapsed posterior
fills); ``latent_ami`` and ``latent_nmi_shuffled`` (recovery beside its chance level:
``workers.metrics.chance_readouts``). ``elbo``: the mean over examples of ``sum_t l_t + KL``
(the negative ELBO in nats, lower is better), the same for every stack, so stacks on
different loss scales stay comparable.

The train split is read on :func:`readout_split`'s fixed, seeded random subset of its rows
(``readouts.train_subset``), not its first rows: a table sorted by label would give one class.

On a registered dataset the kinds are its groups (``SplitData.kinds``), and without a
label column (``SplitData.has_label`` False) the latent-recovery read-outs (NMI, ARI,
I(z; s)) are absent: there is no s to recover.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from objectives import LossInputs, LossStackSpec, token_weight_stats
from workers import metrics as latent_metrics
from workers.contract import ACTIVE_UNITS, KL, MUTUAL_INFO, TRAIN, USED_CATEGORIES
from workers.data import (
    KINDS,
    SyntheticSplit,
    SyntheticTaskConfig,
    kind_layout,
    oracle_conditional_nll,
)
from workers.readouts.confounds import confound_readouts
from workers.readouts.latent import discrete_mi_zs, gaussian_mixture_mi_zs, kl_kappa_spearman
from workers.readouts.surprisal import by_kind, surprisal_readouts

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
class SplitData:
    """One split with everything the read-outs need, on the model's device.

    ``surprisal`` holds the b/h-only read-outs (computed once); ``kappa`` the per-example
    kappa at the trial's alpha (CPU), ``prefix_length`` each example's prefix length.
    A dataset has no oracle: ``cond_nll`` and ``prefix_length`` are None there.
    """

    split: SyntheticSplit
    decoder_input: torch.Tensor
    base_nll: torch.Tensor
    cond_nll: torch.Tensor | None
    prefix_length: torch.Tensor | None
    kappa: torch.Tensor
    surprisal: dict[str, float]
    kinds: tuple[str, ...] = KINDS
    has_label: bool = True

    @classmethod
    def build(cls, config: SyntheticTaskConfig, split: SyntheticSplit, base_nll: torch.Tensor,
              alpha: float, device: torch.device | str) -> SplitData:
        cond = oracle_conditional_nll(config, split)
        surprisal = by_kind(surprisal_readouts, split.kind, base_nll, cond, split.mask, alpha=alpha)
        kappa = token_weight_stats(base_nll.double(), split.mask, alpha).kappa.double()
        split = split.to(device)
        prefix_length, _ = kind_layout(config, split.kind)
        return cls(split, split.decoder_input(), base_nll.to(device), cond.to(device),
                   prefix_length, kappa, surprisal)

    @classmethod
    def build_dataset(cls, split: SyntheticSplit, base_nll: torch.Tensor, alpha: float,
                      device: torch.device | str, kinds: tuple[str, ...],
                      has_label: bool) -> SplitData:
        """A dataset's split: no oracle h_t, no prefix; ``kinds`` are its group names."""
        surprisal = by_kind(surprisal_readouts, split.kind, base_nll, None, split.mask,
                            kinds=kinds, alpha=alpha)
        kappa = token_weight_stats(base_nll.double(), split.mask, alpha).kappa.double()
        split = split.to(device)
        return cls(split, split.decoder_input(), base_nll.to(device), None, None, kappa,
                   surprisal, kinds, has_label)

    def subset(self, indices: torch.Tensor) -> SplitData:
        """The rows ``indices`` (surprisal read-outs recomputed lazily by the caller if needed)."""
        device_indices = indices.to(self.split.context.device)

        def rows(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[device_indices]

        return SplitData(self.split.subset(device_indices), self.decoder_input[device_indices],
                         self.base_nll[device_indices], rows(self.cond_nll),
                         rows(self.prefix_length), self.kappa[indices.cpu()],
                         self.surprisal, self.kinds, self.has_label)


TRAIN_SUBSET_SEED = 0  # fixed: every epoch, and every trial on the same data, reads the same rows


def train_readout_rows(count: int, size: int) -> torch.Tensor:
    """``min(size, count)`` of ``count`` train rows, drawn once with a fixed seed, in row order."""
    if size >= count:
        return torch.arange(count)
    generator = torch.Generator().manual_seed(TRAIN_SUBSET_SEED)
    return torch.randperm(count, generator=generator)[:size].sort().values


def readout_split(data: SplitData, name: str, train_subset: int) -> SplitData:
    """The rows the epoch end reads of split ``name``: train, :func:`train_readout_rows` (a
    random subset, so a label-sorted table's read-out sees every class); val and test, all."""
    if name == TRAIN:
        return data.subset(train_readout_rows(len(data.split), train_subset))
    return data


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
    return latent_metrics.kmeans_labels(collected.posterior_mean.cpu(), num_strategies, seed=seed)


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
        out[ACTIVE_UNITS] = float(latent_metrics.active_units_gaussian(mean))
    out["kl_kappa_spearman"] = kl_kappa_spearman(kl, data.kappa[rows])
    if not data.has_label:
        return out
    truth = data.split.strategy[device_rows].cpu()
    if truth.numel() > 0:
        out.update(latent_metrics.latent_recovery(labels[rows], truth))
    if collected.posterior_probs is not None:
        out["mi_zs"] = discrete_mi_zs(collected.posterior_probs[device_rows], truth, num_strategies)
    else:
        out["mi_zs"] = gaussian_mixture_mi_zs(collected.posterior_mean[device_rows],
                                              collected.posterior_logvar[device_rows], truth, seed,
                                              sampled=sampled)
    return out


def model_readouts(collected: Collected, data: SplitData, stack, diagnostics, *, step: int,
                   num_strategies: int, seed: int, alpha: float) -> dict[str, float]:
    """Overall and per-kind model read-outs of one split (names in the module docstring)."""
    labels = _latent_labels(collected, num_strategies, seed) if data.has_label else torch.zeros(0)
    everything = torch.arange(len(data.split))
    args = (stack, diagnostics, step, num_strategies, seed)
    # The whole split's posterior samples serve I(x; z) and its I(z; s): drawn once.
    sampled = (latent_metrics.posterior_samples(collected.posterior_mean, collected.posterior_logvar, seed)
               if collected.posterior_probs is None and len(data.split) else None)
    out = _group_readouts(collected, data, everything, labels, *args, sampled=sampled)
    if data.has_label and len(data.split):
        out.update(latent_metrics.chance_readouts(labels, data.split.strategy.cpu()))
        out.update(confound_readouts(labels, data.split.mask, data.kappa))
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
        out[MUTUAL_INFO] = latent_metrics.discrete_mutual_information(probs)
        out[ACTIVE_UNITS] = float(latent_metrics.active_units_discrete(probs))
        out[USED_CATEGORIES] = float(latent_metrics.used_categories(probs))
    else:
        out[MUTUAL_INFO] = latent_metrics.gaussian_mutual_information(
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

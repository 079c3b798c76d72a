"""Each read-out on a case with a known answer (workers/readouts)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from objectives import LossStackSpec
from workers.readouts.gradients import gradient_shares, reconstruction_spec, token_groups
from workers.readouts.latent import discrete_mi_zs, gaussian_mixture_mi_zs, kl_kappa_spearman
from workers.readouts.speed import epochs_to_threshold, nmi_auc
from workers.readouts.surprisal import by_kind, surprisal_readouts


def test_surprisal_readouts_by_hand() -> None:
    # Row 0: b = [1, 1], h = [0, 1]: half the surprisal is explained, kappa = 1 at any alpha.
    # Row 1: b = [3, 1], h = [3, 1] (nothing explained); alpha 1: kappa = m2/m1^2 = 5/4.
    b = torch.tensor([[1.0, 1.0], [3.0, 1.0]])
    h = torch.tensor([[0.0, 1.0], [3.0, 1.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = surprisal_readouts(b, h, mask, alpha=1.0)
    assert out["kappa_mean"] == pytest.approx((1 + 1.25) / 2)
    assert out["inv_kappa_mean"] == pytest.approx((1 + 0.8) / 2)
    assert out["kappa_p50"] == pytest.approx(1.125)
    assert out["b_u"] == pytest.approx((1 + 2) / 2)
    assert out["pi_explained_share"] == pytest.approx((0.5 + 0.0) / 2)
    assert out["pi_unexplained_share"] == pytest.approx(0.75)
    at_zero = surprisal_readouts(b, h, mask, alpha=0.0)
    assert at_zero["kappa_p10"] == at_zero["kappa_p90"] == pytest.approx(1.0)
    per_kind = by_kind(surprisal_readouts, torch.tensor([0, 2]), b, h, mask, alpha=1.0)
    assert per_kind["prefix/kappa_mean"] == pytest.approx(1.0)
    assert per_kind["private/kappa_mean"] == pytest.approx(1.25)
    assert "diffuse/kappa_mean" not in per_kind  # a kind absent from the split logs nothing


def test_discrete_mi_zs_known_cases() -> None:
    s = torch.arange(4).repeat(250)
    relabelled = torch.nn.functional.one_hot((s + 1) % 4, 4).float()
    assert discrete_mi_zs(relabelled, s, 4) == pytest.approx(math.log(4), abs=1e-9)
    assert discrete_mi_zs(torch.full((1000, 4), 0.25), s, 4) == pytest.approx(0.0, abs=1e-12)
    # q merges strategies {0,1} and {2,3}: exactly one bit.
    merged = torch.nn.functional.one_hot(s // 2, 4).float()
    assert discrete_mi_zs(merged, s, 4) == pytest.approx(math.log(2), abs=1e-9)


def test_gaussian_mixture_mi_zs_known_cases() -> None:
    generator = torch.Generator().manual_seed(0)
    s = torch.arange(4).repeat(100)
    centres = 20.0 * torch.eye(4, 3)
    separated = centres[s] + 0.1 * torch.randn(400, 3, generator=generator)
    logvar = torch.full((400, 3), math.log(0.01))
    assert gaussian_mixture_mi_zs(separated, logvar, s) == pytest.approx(math.log(4), abs=0.02)
    independent = torch.randn(400, 3, generator=generator)
    assert gaussian_mixture_mi_zs(independent, torch.zeros(400, 3), s) < 0.05


def test_mixture_log_density_and_shared_samples() -> None:
    """``log_mixture`` equals an independent per-pair sum of ``torch.distributions.Normal``
    log densities (tiny and huge variances, far-off means, blocks of 3 rows), and both
    Gaussian MI read-outs give the same value whether they draw the samples or are handed
    ``posterior_samples`` (what ``model_readouts`` does for the whole split)."""
    from workers.readouts import recovery as metrics
    from workers.readouts.recovery import (
        gaussian_mutual_information,
        log_mixture,
        posterior_samples,
    )

    generator = torch.Generator().manual_seed(4)
    mean = torch.randn(9, 3, generator=generator, dtype=torch.float64) * torch.tensor([1.0, 50.0, 1e-3],
                                                                                      dtype=torch.float64)
    logvar = torch.randn(9, 3, generator=generator, dtype=torch.float64) * 6.0  # variances e^-18..e^18
    samples = torch.randn(7, 3, generator=generator, dtype=torch.float64) * 10.0
    pairs = torch.distributions.Normal(mean[None], torch.exp(0.5 * logvar)[None]).log_prob(samples[:, None])
    expected = torch.logsumexp(pairs.sum(-1), dim=1) - math.log(9)
    previous = metrics._MI_BLOCK_ELEMENTS
    metrics._MI_BLOCK_ELEMENTS = 3 * 9 * 3  # three sample rows per block
    try:
        got = log_mixture(samples, mean, logvar)
    finally:
        metrics._MI_BLOCK_ELEMENTS = previous
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-9)
    s = torch.tensor([0, 1, 1, 2, 0, 2, 2, 1, 0])
    sampled = posterior_samples(mean, logvar, 11)
    assert gaussian_mutual_information(mean, logvar, 11) == gaussian_mutual_information(
        mean, logvar, 11, sampled=sampled)
    assert gaussian_mixture_mi_zs(mean, logvar, s, 11) == gaussian_mixture_mi_zs(mean, logvar, s, 11,
                                                                                  sampled=sampled)


def test_kl_kappa_spearman() -> None:
    kappa = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert kl_kappa_spearman(torch.tensor([0.1, 0.5, 0.7, 9.0]), kappa) == pytest.approx(1.0)
    assert kl_kappa_spearman(torch.tensor([4.0, 3.0, 2.0, 1.0]), kappa) == pytest.approx(-1.0)
    assert math.isnan(kl_kappa_spearman(torch.rand(4), torch.ones(4)))  # alpha 0: kappa == 1


def test_kl_kappa_spearman_equals_scipy_with_ties_and_infinities() -> None:
    """The ranks-then-Pearson rho equals ``scipy.stats.spearmanr`` (ties averaged; an infinity
    ranks last; a NaN gives NaN) wherever the read-out is defined."""
    from scipy.stats import spearmanr

    generator = np.random.default_rng(5)
    for case in range(120):
        n = int(generator.integers(3, 200))
        kl = generator.normal(size=n) if case % 3 else generator.integers(0, 3, n).astype(float)
        kappa = generator.normal(size=n) if case % 5 else generator.integers(0, 2, n) * 1e8 + 1.0
        if case % 7 == 0:
            kl[0] = math.inf
        if case % 13 == 0:
            kappa[1] = -math.inf
        if case % 11 == 0:
            kl[-1] = math.nan
        got = kl_kappa_spearman(torch.tensor(kl), torch.tensor(kappa))
        if case % 11 == 0 or np.ptp(kappa) <= 1e-12 * np.abs(kappa).max():
            assert math.isnan(got)
        else:
            assert got == pytest.approx(spearmanr(kl, kappa).statistic, abs=1e-12)


def test_speed_readouts() -> None:
    assert nmi_auc([0.0, 0.5, 1.0], horizon=5) == pytest.approx((0 + 0.5 + 1 + 1 + 1) / 5)
    assert nmi_auc([0.2, 0.4, 0.6, 0.8], horizon=2) == pytest.approx(0.3)
    assert epochs_to_threshold([0.1, 0.95, 0.3]) == (2.0, 0.0)
    assert epochs_to_threshold([0.1, 0.2, 0.3]) == (3.0, 1.0)  # censored at the epochs trained
    with pytest.raises(ValueError, match="nmi_auc_horizon"):
        nmi_auc([0.1], horizon=0)


def _toy(depends_on_z: torch.Tensor, seed: int = 0):
    """l_t = (theta . u_t - 1)^2 where a token depends on theta, else a constant 1."""
    generator = torch.Generator().manual_seed(seed)
    theta = torch.nn.Parameter(torch.randn(3, generator=generator))
    u = torch.randn(*depends_on_z.shape, 3, generator=generator)

    def token_nll() -> torch.Tensor:
        loss = (u @ theta - 1.0) ** 2
        return torch.where(depends_on_z, loss, torch.ones_like(loss))

    return theta, token_nll


def _groups(b: torch.Tensor, mask: torch.Tensor, prefix: int):
    return token_groups(b, torch.zeros_like(b), mask, torch.zeros(b.shape[0], dtype=torch.long),
                        torch.full((b.shape[0],), prefix))


def test_gradient_share_is_one_when_only_the_prefix_depends_on_z() -> None:
    b = torch.rand(8, 6) + 0.5
    mask = torch.ones(8, 6, dtype=torch.bool)
    prefix = torch.zeros(8, 6, dtype=torch.bool)
    prefix[:, :2] = True
    theta, token_nll = _toy(prefix)
    for preset in ("uniform", "raw_token_weighted", "ncc"):
        stack = reconstruction_spec(LossStackSpec(preset=preset, alpha=1.0)).build(c_base=1.0)
        shares = gradient_shares(token_nll, [theta], stack, b, mask, _groups(b, mask, 2))
        assert shares["grad_share_prefix"] == pytest.approx(1.0, abs=1e-9), preset
        assert shares["grad_share_kind_prefix"] == pytest.approx(1.0, abs=1e-9)


def test_gradient_share_goes_to_the_max_b_tokens_at_large_alpha() -> None:
    b = torch.rand(8, 10) + 0.5
    b[:, 3] = 5.0  # the most surprising token of every row: 10% of the tokens
    mask = torch.ones(8, 10, dtype=torch.bool)
    theta, token_nll = _toy(torch.ones(8, 10, dtype=torch.bool))
    groups = _groups(b, mask, 0)
    stack = reconstruction_spec(LossStackSpec(preset="raw_token_weighted", alpha=40.0)).build()
    shares = gradient_shares(token_nll, [theta], stack, b, mask, groups)
    assert shares["grad_share_top_decile_b"] == pytest.approx(1.0, abs=1e-6)
    # At alpha 0 every token weighs the same, so the max-b tokens get about their 10%.
    uniform = reconstruction_spec(LossStackSpec(preset="uniform", alpha=0.0)).build()
    assert abs(gradient_shares(token_nll, [theta], uniform, b, mask, groups)["grad_share_top_decile_b"]) < 0.5


def test_gradient_shares_of_a_partition_sum_to_one() -> None:
    b = torch.rand(8, 6) + 0.5
    h = 0.5 * b
    mask = torch.ones(8, 6, dtype=torch.bool)
    mask[0, 4:] = False
    theta, token_nll = _toy(torch.ones(8, 6, dtype=torch.bool))
    groups = token_groups(b, h, mask, torch.zeros(8, dtype=torch.long), torch.full((8,), 2))
    groups["body"] = mask & ~groups["prefix"]
    groups["unexplained"] = torch.where(mask, 1.0 - groups["explained"], 0.0)
    assert groups["explained"][mask].allclose(torch.full_like(b[mask], 0.5))  # b - h = h
    stack = reconstruction_spec(LossStackSpec(preset="raw_plus_ncc", alpha=1.0)).build(c_base=2.0)
    shares = gradient_shares(token_nll, [theta], stack, b, mask, groups)
    assert shares["grad_share_prefix"] + shares["grad_share_body"] == pytest.approx(1.0)
    assert shares["grad_share_explained"] + shares["grad_share_unexplained"] == pytest.approx(1.0)
    assert shares["grad_share_explained"] == pytest.approx(0.5)


def test_reconstruction_spec_keeps_only_the_linear_terms() -> None:
    spec = LossStackSpec(preset="raw_plus_ncc", alpha=2.0, terms={"kl": 0.5})
    recon = reconstruction_spec(spec)
    assert set(recon.resolved_terms()) == {"token_weighted", "normalized_concentration_corrected"}
    assert recon.alpha == 2.0
    assert reconstruction_spec(LossStackSpec(terms={"kl": 1.0})) is None


@pytest.mark.parametrize("family", ["discrete", "continuous"])
def test_gradient_shares_are_measured_on_the_posteriors_own_parameters(family) -> None:
    """q(z|x,y)'s target encoder and head: not the token embedding it shares with the decoder,
    whose gradient also comes from the decoder's own inputs (not through z)."""
    from workers.models.cvae import CVAE
    from workers.readouts.gradients import posterior_parameters
    from workers.train import load_trial_config

    config = load_trial_config(Path(__file__).resolve().parents[2] / "workers" / "examples" / f"{family}.yaml")
    model = CVAE(config.model, vocab_size=12, num_strategies=3)
    chosen = {id(p) for p in posterior_parameters(model)}
    own = {id(p) for p in [*model.target_encoder.gru.parameters(), *model.posterior_head.parameters()]}
    assert chosen == own
    assert not chosen & {id(p) for p in [*model.embedding.parameters(), *model.decoder.parameters()]}
    # The target encoder's module holds the shared embedding too: its .parameters() would not do.
    assert {id(p) for p in model.target_encoder.parameters()} - chosen == {id(model.embedding.weight)}


def _readouts_of(posterior_probs=None, mean=None, logvar=None, labels=None) -> dict[str, float]:
    """``model_readouts`` of a split whose model outputs are given (tokens and losses fixed)."""
    from workers.data import SyntheticSplit
    from workers.readouts.evaluate import Collected, diagnostic_stack, model_readouts
    from workers.readouts.split_data import SplitData

    n = len(labels)
    split = SyntheticSplit(context=torch.zeros(n, 1, dtype=torch.long),
                           target=torch.ones(n, 2, dtype=torch.long), mask=torch.ones(n, 2, dtype=torch.bool),
                           strategy=labels, kind=torch.zeros(n, dtype=torch.long))
    data = SplitData(split, split.target, torch.ones(n, 2), None, None, torch.ones(n, dtype=torch.float64), {})
    collected = Collected(token_nll=torch.ones(n, 2), kl=torch.zeros(n), bow_logits=torch.zeros(n, 3),
                          posterior_probs=posterior_probs, posterior_mean=mean, posterior_logvar=logvar)
    stack = LossStackSpec(preset="uniform", alpha=0.0).build(c_base=1.0)
    return model_readouts(collected, data, stack, diagnostic_stack(0.0, 1.0), step=0,
                          num_strategies=4, seed=0, alpha=0.0)


def test_latent_use_known_cases() -> None:
    """A posterior that is a one-hot relabelling of a balanced 4-class label reads I(x; z) = log 4,
    AMI = 1 and 4 active units; a constant latent (discrete: the same spread posterior for every
    x; continuous: the same Gaussian) reads I = 0 and 0 active units, while the discrete one's
    ``used_categories`` still reads 4 (what the old discrete ``active_units`` counted)."""
    labels = torch.arange(4).repeat(100)
    relabelled = _readouts_of(
        torch.nn.functional.one_hot((labels + 1) % 4, 4).float(), labels=labels)
    assert relabelled["mutual_info"] == pytest.approx(math.log(4), abs=1e-12)
    assert relabelled["latent_ami"] == pytest.approx(1.0, abs=1e-12)
    assert relabelled["latent_nmi"] == pytest.approx(1.0, abs=1e-12)
    assert relabelled["active_units"] == 4 and relabelled["used_categories"] == 4
    constant = _readouts_of(torch.full((400, 4), 0.25), labels=labels)
    assert constant["mutual_info"] == 0.0 and constant["active_units"] == 0
    assert constant["used_categories"] == 4
    assert constant["latent_ami"] == pytest.approx(0.0, abs=1e-12)
    gaussian = _readouts_of(mean=torch.full((400, 3), 0.5), logvar=torch.full((400, 3), -1.0), labels=labels)
    assert gaussian["mutual_info"] == pytest.approx(0.0, abs=1e-12) and gaussian["active_units"] == 0
    assert "used_categories" not in gaussian
    separated = _readouts_of(mean=30.0 * torch.eye(4, 3)[(labels + 1) % 4], logvar=torch.zeros(400, 3),
                             labels=labels)
    assert separated["mutual_info"] == pytest.approx(math.log(4), abs=1e-9)
    assert separated["active_units"] == 3 and separated["latent_ami"] == pytest.approx(1.0, abs=1e-12)


def test_train_readout_rows_are_a_fixed_random_subset() -> None:
    """A label-sorted train split's read-out rows see every class (its first rows would see one),
    are the same on every call, come in row order, and are every row when the subset is larger."""
    from workers.readouts.split_data import train_readout_rows

    labels = torch.arange(4).repeat_interleave(250)  # sorted: the first 256 rows are class 0 and 1
    assert set(labels[:256].tolist()) == {0, 1}
    rows = train_readout_rows(1000, 256)
    assert rows.shape == (256,) and len(set(rows.tolist())) == 256
    assert torch.equal(rows, train_readout_rows(1000, 256)) and torch.equal(rows, rows.sort().values)
    counts = torch.bincount(labels[rows], minlength=4)
    assert (counts >= 40).all(), counts
    assert torch.equal(train_readout_rows(100, 256), torch.arange(100))

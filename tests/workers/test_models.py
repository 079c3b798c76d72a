"""CVAE shapes, gradients and the discrete enumeration identity."""

import math

import pytest
import torch

from workers.data import SyntheticTaskConfig, generate_split
from workers.models import CVAE, BaseDecoder, ModelConfig

TASK = SyntheticTaskConfig(train_size=16, val_size=8, num_strategies=3, content_vocab=6)


@pytest.fixture(scope="module")
def batch():
    split = generate_split(TASK, "train")
    return split.context, split.decoder_input(), split.target, split.mask


@pytest.mark.parametrize(
    ("family", "estimator", "kl_shape"),
    [("discrete", "enumerate", (16,)), ("discrete", "gumbel", (16,)), ("continuous", "enumerate", (16, 5))],
)
def test_shapes_and_gradients(batch, family, estimator, kl_shape):
    torch.manual_seed(0)
    model = CVAE(ModelConfig(family=family, discrete_estimator=estimator, latent_dim=5),
                 TASK.vocab_size, TASK.num_strategies)
    out = model(*batch)
    context, decoder_input, target, mask = batch
    assert out.token_nll.shape == target.shape
    assert out.kl.shape == kl_shape
    assert out.bow_logits.shape == (16, TASK.vocab_size)
    assert torch.all(out.token_nll[~mask] == 0), "PAD positions must have zero NLL"
    assert torch.all(out.kl >= -1e-6)
    # An untrained model is close to uniform over the vocabulary.
    mean_nll = float(out.token_nll[mask].mean())
    assert abs(mean_nll - math.log(TASK.vocab_size)) < 0.5
    (out.token_nll.sum() + out.kl.sum()).backward()
    for name, parameter in model.named_parameters():
        if name.startswith("bow_head") or (family == "continuous" and name.startswith("latent")):
            continue
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
    if family == "discrete":
        assert torch.allclose(out.posterior_probs.sum(-1), torch.ones(16), atol=1e-6)
    else:
        assert out.posterior_mean.shape == (16, 5)


def test_enumeration_is_the_posterior_expectation(batch):
    """token_nll under enumeration = sum_k q(k) * NLL with z = k (computed one k at a time)."""
    torch.manual_seed(1)
    model = CVAE(ModelConfig(family="discrete"), TASK.vocab_size, TASK.num_strategies).eval()
    context, decoder_input, target, mask = batch
    with torch.no_grad():
        out = model(*batch)
        h_context = model.context_encoder(context)
        expected = torch.zeros_like(out.token_nll)
        for k in range(TASK.num_strategies):
            z = model.latent_embedding.weight[k].expand(len(context), -1)
            nll = model.decoder.token_nll(decoder_input, target, torch.cat([h_context, z], -1))
            expected += out.posterior_probs[:, k : k + 1] * nll
    torch.testing.assert_close(out.token_nll, expected, rtol=1e-5, atol=1e-6)


def test_standard_prior_kl_matches_closed_form(batch):
    torch.manual_seed(2)
    model = CVAE(ModelConfig(family="continuous", prior="standard", latent_dim=3),
                 TASK.vocab_size, TASK.num_strategies)
    out = model(*batch)
    mean, logvar = out.posterior_mean, out.posterior_logvar
    closed = 0.5 * (mean**2 + logvar.exp() - 1 - logvar)
    torch.testing.assert_close(out.kl, closed)
    discrete = CVAE(ModelConfig(family="discrete", prior="standard"), TASK.vocab_size, 3)
    out = discrete(*batch)
    q = out.posterior_probs
    torch.testing.assert_close(out.kl, (q * (q.log() + math.log(3))).sum(-1), rtol=1e-5, atol=1e-6)


def test_gumbel_temperature_anneals():
    model = CVAE(ModelConfig(gumbel_temperature_start=1.0, gumbel_temperature_end=0.25,
                             gumbel_anneal_steps=100), TASK.vocab_size, 3)
    assert model.gumbel_temperature() == pytest.approx(1.0)
    model.step = 50
    assert model.gumbel_temperature() == pytest.approx(0.5)
    model.step = 1000
    assert model.gumbel_temperature() == pytest.approx(0.25)


def test_base_decoder_shapes(batch):
    model = BaseDecoder(ModelConfig(), TASK.vocab_size)
    context, decoder_input, target, mask = batch
    nll = model(context, decoder_input, target)
    assert nll.shape == target.shape and torch.all(nll[~mask] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_evaluation_nll_at_tokens_equals_the_full_vocabulary_cross_entropy(dtype):
    """Adversarial rows for the evaluation path's packed output layer: all PAD, no PAD, PAD in
    the middle, huge logits; against F.cross_entropy over every position (an independent path)."""
    from workers.data import PAD_ID
    from workers.models.backbone import nll_at_tokens

    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, 7, 4, generator=generator, dtype=dtype) * 30  # logits far from 0
    weight, bias = torch.randn(11, 4, generator=generator, dtype=dtype), torch.randn(11, dtype=dtype)
    target = torch.randint(1, 11, (5, 7), generator=generator)
    target[0] = PAD_ID  # a row with no token
    target[2, 3:] = PAD_ID
    target[3, 1] = PAD_ID  # PAD between tokens
    expected = torch.nn.functional.cross_entropy(
        (hidden @ weight.T + bias).reshape(-1, 11), target.reshape(-1), reduction="none",
        ignore_index=PAD_ID).view_as(target)
    got = nll_at_tokens(hidden.reshape(1, -1, 4), target.reshape(1, -1), weight[None], bias[None]).view_as(target)
    assert got.dtype == expected.dtype and torch.allclose(got, expected, rtol=1e-6, atol=0)
    assert torch.all(got[target == PAD_ID] == 0) and torch.all(got[target != PAD_ID] >= 0)
    assert nll_at_tokens(hidden[:1], torch.zeros(1, 7, dtype=torch.long), weight[None], bias[None]).abs().sum() == 0
    # K = 2 output layers whose rows hold tokens at different positions: each its own values.
    other_weight, other_bias = weight.flip(0), bias.flip(0)
    other_target = target.roll(1, dims=1)
    stacked = nll_at_tokens(torch.stack([hidden.reshape(-1, 4)] * 2), torch.stack([target.reshape(-1), other_target.reshape(-1)]),
                            torch.stack([weight, other_weight]), torch.stack([bias, other_bias]))
    other = torch.nn.functional.cross_entropy(
        (hidden @ other_weight.T + other_bias).reshape(-1, 11), other_target.reshape(-1), reduction="none",
        ignore_index=PAD_ID)
    assert torch.allclose(stacked[0], expected.reshape(-1), rtol=1e-6, atol=0)
    assert torch.allclose(stacked[1], other, rtol=1e-6, atol=0)


@pytest.mark.parametrize("family", ["discrete", "continuous"])
def test_the_evaluation_forward_gives_the_training_paths_numbers(batch, family):
    """Without a gradient the decoder projects only its token positions; the module and the
    stacked functional forward give, per token, what the full projection gives."""
    from workers.models.functional import cvae_forward

    torch.manual_seed(0)
    model = CVAE(ModelConfig(family=family, latent_dim=5), TASK.vocab_size, TASK.num_strategies).double().eval()
    args = [t.double() if t.is_floating_point() else t for t in batch]
    with torch.enable_grad():
        full = model(*args).token_nll.detach()
    with torch.no_grad():
        packed = model(*args).token_nll
        params = {name: p.detach().unsqueeze(0) for name, p in model.named_parameters()}
        stacked = cvae_forward(params, model.config, model.num_categories,
                               *[t.unsqueeze(0) for t in args], training=False)["token_nll"][0]
    with torch.enable_grad():
        params = {name: p.detach().unsqueeze(0).requires_grad_() for name, p in model.named_parameters()}
        stacked_full = cvae_forward(params, model.config, model.num_categories,
                                    *[t.unsqueeze(0) for t in args], training=False)["token_nll"][0].detach()
    assert torch.allclose(packed, full, rtol=1e-12, atol=1e-12)
    assert torch.allclose(stacked, stacked_full, rtol=1e-12, atol=1e-12)
    assert torch.allclose(stacked, full, rtol=1e-9, atol=1e-9)

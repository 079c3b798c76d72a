"""Gradients of the token-weighted objectives: gradcheck, analytic values, no gradient to b."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from objectives import (
    concentration_corrected_reconstruction,
    normalized_concentration_corrected_reconstruction,
    normalized_concentration_corrected_token_weighted_reconstruction_loss,
    token_weight_stats,
    token_weighted_reconstruction,
)

C_BASE = 1.75


def _fixture_batch(seed: int = 0):
    """A float64 batch with a full row, a partial row, zeros, an all-zero row and an empty row."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.rand(5, 6, generator=generator, dtype=torch.float64) * 6
    base[1, 2] = 0.0
    base[2] = 0.0
    token = torch.rand(5, 6, generator=generator, dtype=torch.float64) * 6
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, ::2] = False
    mask[4] = False
    base = torch.where(mask, base, torch.tensor(float("nan"), dtype=torch.float64))
    token = torch.where(mask, token, torch.tensor(float("inf"), dtype=torch.float64))
    return token, base, mask


def _finite_padding(token, base, mask):
    """gradcheck perturbs every entry; keep off-mask entries finite there."""
    return torch.where(mask, token, 3.0), torch.where(mask, base, 2.0), mask


PER_EXAMPLE = {
    "token_weighted": lambda t, b, m, a: token_weighted_reconstruction(t, b, m, a),
    "concentration_corrected": lambda t, b, m, a: concentration_corrected_reconstruction(t, b, m, a),
    "normalized": lambda t, b, m, a: normalized_concentration_corrected_reconstruction(
        t, b, m, a, C_BASE
    ),
    "scalar_loss": lambda t, b, m, a: (
        normalized_concentration_corrected_token_weighted_reconstruction_loss(t, b, m, a, C_BASE)
    ),
}


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0, 20.0])
@pytest.mark.parametrize("name", list(PER_EXAMPLE))
def test_gradcheck_wrt_token_nll(name, alpha):
    token, base, mask = _finite_padding(*_fixture_batch())
    fn = PER_EXAMPLE[name]
    token = token.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: fn(t, base, mask, alpha), (token,), eps=1e-6,
                                    atol=1e-7, rtol=1e-6)
    assert torch.autograd.gradgradcheck(lambda t: fn(t, base, mask, alpha), (token,))


def _reference_jacobians(ref, token, base, mask, alpha):
    expected = ref.batch(base, mask, alpha, token_nll=token, c_base=C_BASE)
    pi = expected["weights"]
    kappa = expected["kappa"]
    active = mask.any(-1)
    safe_kappa = torch.where(active, kappa, torch.ones_like(kappa))
    n_rows = int(active.sum())
    return pi, pi / safe_kappa[:, None], pi / (safe_kappa[:, None] * C_BASE * max(n_rows, 1))


def _row_gradients(fn, token, base, mask, alpha):
    """d out_i / d l_{i,t} for a per-example fn: the gradient of sum_i out_i."""
    token = token.clone().requires_grad_(True)
    out = fn(token, base, mask, alpha)
    (grad,) = torch.autograd.grad(out.sum(), token)
    return grad


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0, 4.0, 20.0])
def test_analytic_gradients(ref, alpha):
    token, base, mask = _fixture_batch(seed=11)
    d_tok, d_tilde, d_loss = _reference_jacobians(ref, token, base, mask, alpha)
    grad_tok = _row_gradients(PER_EXAMPLE["token_weighted"], token, base, mask, alpha)
    grad_tilde = _row_gradients(PER_EXAMPLE["concentration_corrected"], token, base, mask, alpha)
    grad_hat = _row_gradients(PER_EXAMPLE["normalized"], token, base, mask, alpha)
    grad_loss = _row_gradients(PER_EXAMPLE["scalar_loss"], token, base, mask, alpha)
    tol = dict(rtol=1e-9, atol=1e-300)
    torch.testing.assert_close(grad_tok, d_tok, **tol)
    torch.testing.assert_close(grad_tilde, d_tilde, **tol)
    torch.testing.assert_close(grad_hat, d_tilde / C_BASE, **tol)
    torch.testing.assert_close(grad_loss, d_loss, **tol)
    for grad in (grad_tok, grad_tilde, grad_hat, grad_loss):
        assert torch.isfinite(grad).all()
        assert (grad[~mask] == 0).all()
        assert (grad[4] == 0).all()  # the empty row
    # Each token's gradient of R_tok is exactly its weight pi_t.
    torch.testing.assert_close(grad_tok, token_weight_stats(base, mask, alpha).weights, **tol)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    alpha=st.one_of(st.just(0.0), st.integers(0, 20).map(float), st.floats(0, 20)),
    b_size=st.integers(1, 6),
    t_size=st.integers(1, 12),
)
def test_scalar_loss_gradient_matches_formula_random(ref, seed, alpha, b_size, t_size):
    generator = torch.Generator().manual_seed(seed)
    base = torch.rand(b_size, t_size, generator=generator, dtype=torch.float64) * 100
    base = torch.where(torch.rand(b_size, t_size, generator=generator) < 0.2, 0.0, base)
    token = torch.rand(b_size, t_size, generator=generator, dtype=torch.float64) * 10
    mask = torch.rand(b_size, t_size, generator=generator) < 0.7
    grad_loss = _row_gradients(PER_EXAMPLE["scalar_loss"], token, base, mask, alpha)
    _, _, d_loss = _reference_jacobians(ref, token, base, mask, alpha)
    torch.testing.assert_close(grad_loss, d_loss, rtol=1e-9, atol=1e-300)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(PER_EXAMPLE))
def test_base_nll_receives_no_gradient(name, dtype):
    token, base, mask = _fixture_batch()
    token = token.to(dtype).requires_grad_(True)
    base = base.to(dtype).requires_grad_(True)
    out = PER_EXAMPLE[name](token, base, mask, 1.5)
    out.sum().backward()
    assert base.grad is None
    assert token.grad is not None and torch.isfinite(token.grad).all()


def test_token_weight_stats_carry_no_graph_to_base_nll():
    _, base, mask = _fixture_batch()
    base = base.requires_grad_(True)
    stats = token_weight_stats(base, mask, 2.0)
    for value in (stats.weights, stats.kappa, stats.base_uniform, stats.base_weighted):
        assert not value.requires_grad


@pytest.mark.parametrize("alpha", [0.0, 1.0, 20.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_of_extreme_rows_match_reference(ref, dtype, alpha):
    base = torch.tensor(
        [[100.0, 1e-25, 0.0, 50.0], [1e-30, 1e-25, 1e-28, 0.0], [0.0, 0.0, 0.0, 0.0],
         [float("nan")] * 4],
        dtype=dtype,
    )
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    token = torch.where(mask, torch.full_like(base, 2.0), torch.tensor(float("nan"), dtype=dtype))
    leaf = token.clone().requires_grad_(True)
    normalized_concentration_corrected_token_weighted_reconstruction_loss(
        leaf, base, mask, alpha, C_BASE
    ).backward()
    assert torch.isfinite(leaf.grad).all()
    assert (leaf.grad[~mask] == 0).all()
    _, _, d_loss = _reference_jacobians(ref, token, base, mask, alpha)
    torch.testing.assert_close(leaf.grad.to(torch.float64), d_loss, rtol=1e-4, atol=1e-37)

"""The KL term's mutual_info_credit: mean KL - gamma * I_batch(x; z), I from a discrete q."""

import math

import numpy as np
import pytest
import torch

from objectives import LossInputs, LossStackSpec
from objectives.terms import batch_mutual_information


def _numpy_mutual_information(probs: np.ndarray, active: np.ndarray) -> float:
    """An independent I(x; z) = H(mean q) - mean H(q) over the active rows, in float64."""
    q = probs[active].astype(np.float64)

    def entropy(p: np.ndarray) -> np.ndarray:
        return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)

    return float(entropy(q.mean(axis=0)) - entropy(q).mean())


def _inputs(probs: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor) -> LossInputs:
    token = torch.ones(mask.shape, dtype=torch.float64)
    return LossInputs(token_nll=token, base_nll=token.clone(), mask=mask, kl=kl, posterior_probs=probs)


def _kl_term(credit: float, inputs: LossInputs, weight: float = 1.0, **options):
    spec = LossStackSpec(terms={"kl": {"weight": weight, "options": {"mutual_info_credit": credit, **options}}})
    return spec.build()(inputs)


def _weights(mask: torch.Tensor) -> torch.Tensor:
    active = mask.any(-1).double()
    return active / active.sum().clamp_min(1)


@pytest.mark.parametrize("k", [2, 4, 7])
def test_one_hot_relabelling_of_a_balanced_label_gives_log_k(k):
    labels = torch.arange(4 * k) % k
    probs = torch.nn.functional.one_hot((labels + 1) % k, k).double()
    mask = torch.ones(4 * k, 3, dtype=torch.bool)
    assert float(batch_mutual_information(_inputs(probs, torch.zeros(4 * k), mask), _weights(mask))) \
        == pytest.approx(math.log(k), abs=1e-12)


def test_constant_posterior_gives_zero_one_category_or_spread():
    mask = torch.ones(6, 2, dtype=torch.bool)
    for row in ([1.0, 0.0, 0.0], [0.2, 0.5, 0.3]):
        probs = torch.tensor([row] * 6, dtype=torch.float64)
        value = batch_mutual_information(_inputs(probs, torch.zeros(6), mask), _weights(mask))
        assert float(value) == pytest.approx(0.0, abs=1e-12)


def test_matches_an_independent_computation_on_adversarial_rows():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 5, generator=generator, dtype=torch.float64) * 30  # near one-hot rows
    probs = logits.softmax(-1)
    probs[:5] = torch.nn.functional.one_hot(torch.arange(5) % 5, 5).double()  # exact zeros
    mask = torch.rand(40, 6, generator=generator) > 0.4
    mask[7:10] = False  # rows without an active token are left out
    value = batch_mutual_information(_inputs(probs, torch.zeros(40), mask), _weights(mask))
    expected = _numpy_mutual_information(probs.numpy(), mask.any(-1).numpy())
    assert float(value) == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_kl_term_is_mean_kl_minus_credit_times_information():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5], [0.3, 0.7]], dtype=torch.float64)
    kl = torch.tensor([0.4, 0.3, 0.0, 2.0], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False], [True, True], [False, False]])
    information = _numpy_mutual_information(probs.numpy(), mask.any(-1).numpy())
    for credit in (0.0, 0.5, 1.0):
        out = _kl_term(credit, _inputs(probs, kl, mask), weight=0.25)
        expected = (0.4 + 0.3 + 0.0) / 3 - credit * information
        assert float(out.terms["kl"]) == pytest.approx(expected, rel=1e-12)
        assert float(out.total) == pytest.approx(0.25 * expected, rel=1e-12)


def test_free_bits_clamp_the_kl_before_the_credit():
    probs = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    kl = torch.tensor([0.1, 0.9], dtype=torch.float64)
    out = _kl_term(1.0, _inputs(probs, kl, torch.ones(2, 1, dtype=torch.bool)), free_bits=0.5)
    assert float(out.terms["kl"]) == pytest.approx((0.5 + 0.9) / 2 - math.log(2), rel=1e-12)


def test_gradient_is_the_analytic_one_and_finite_at_exact_zeros():
    probs = torch.tensor([[0.7, 0.3], [0.9, 0.1], [0.6, 0.4]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(3, 2, dtype=torch.bool)
    _kl_term(1.0, _inputs(probs, torch.zeros(3, dtype=torch.float64), mask)).total.backward()
    # d(-I)/dq_bk = w_b (log mean_q_k - log q_bk), with w_b = 1/3.
    q = probs.detach()
    assert torch.allclose(probs.grad, (q.mean(0).log() - q.log()) / 3, rtol=1e-12, atol=0)

    zeros = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    _kl_term(1.0, _inputs(zeros, torch.zeros(2, dtype=torch.float64), mask[:2])).total.backward()
    assert torch.isfinite(zeros.grad).all()


def test_credit_needs_a_discrete_posterior():
    mask = torch.ones(2, 2, dtype=torch.bool)
    inputs = LossInputs(token_nll=torch.ones(2, 2), base_nll=torch.ones(2, 2), mask=mask,
                        kl=torch.zeros(2))
    with pytest.raises(ValueError, match="mutual_info_credit needs LossInputs.posterior_probs"):
        _kl_term(0.5, inputs)
    assert float(_kl_term(0.0, inputs).total) == 0.0  # no credit: q is not read


@pytest.mark.parametrize("credit", [-0.1, 1.5, math.nan])
def test_credit_outside_zero_one_is_rejected_naming_it(credit):
    with pytest.raises(ValueError, match="mutual_info_credit"):
        LossStackSpec(terms={"kl": {"weight": 1.0, "options": {"mutual_info_credit": credit}}})

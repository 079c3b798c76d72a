"""R_tok / mean_train(kappa): one global concentration correction, beside R~'s per-example one."""

import pytest
import torch

from objectives import LossInputs, LossStackSpec, token_weight_stats
from sweeps.plan.equivalence import objective_signature


def _batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    base = torch.rand(6, 7, generator=generator, dtype=torch.float64) * 5
    base[0, :3] = 0.0  # zero surprisal: weight 0 at alpha > 0
    mask = torch.rand(6, 7, generator=generator) > 0.3
    mask[4] = False  # a row with no active token is left out
    token = torch.rand(6, 7, generator=generator, dtype=torch.float64, requires_grad=True)
    return token, base, mask


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_value_and_gradient_are_r_tok_divided_by_the_train_mean_kappa(alpha):
    token, base, mask = _batch()
    kappa = 1.7
    stack = LossStackSpec(preset="train_kappa_corrected", alpha=alpha).build(train_kappa={alpha: kappa})
    out = stack(LossInputs(token_nll=token, base_nll=base, mask=mask))
    out.total.backward()
    grad = token.grad.clone()
    token.grad = None
    weights = token_weight_stats(base, mask, alpha).weights
    active = mask.any(-1)
    r_tok = (weights * token).sum(-1)[active].mean()
    assert float(out.total) == pytest.approx(float(r_tok) / kappa, rel=1e-12)
    r_tok.backward()
    assert torch.allclose(grad, token.grad / kappa, rtol=1e-12, atol=0)


def test_a_terms_own_alpha_is_looked_up():
    token, base, mask = _batch(1)
    spec = LossStackSpec(alpha=1.0, terms={"train_kappa_corrected": {"weight": 1.0, "options": {"alpha": 2.0}}})
    direct = LossStackSpec(preset="raw_token_weighted", alpha=2.0).build()
    inputs = LossInputs(token_nll=token.detach(), base_nll=base, mask=mask)
    assert float(spec.build(train_kappa={2.0: 3.0})(inputs).total) == pytest.approx(
        float(direct(inputs).total) / 3.0, rel=1e-12)
    with pytest.raises(ValueError, match=r"train_kappa_corrected\) at alpha 2"):
        spec.build(train_kappa={1.0: 3.0})


@pytest.mark.parametrize("bad", [{1.0: float("nan")}, {1.0: 0.5}])
def test_missing_or_impossible_means_are_refused(bad):
    spec = LossStackSpec(preset="train_kappa_corrected", alpha=1.0)
    with pytest.raises(ValueError, match="mean kappa is required"):
        spec.build()
    with pytest.raises(ValueError, match="train_kappa must be finite"):
        spec.build(train_kappa=bad)


def test_at_alpha_zero_it_is_the_uniform_objective():
    uniform = objective_signature(LossStackSpec(preset="uniform", alpha=0.0))
    assert objective_signature(LossStackSpec(preset="train_kappa_corrected", alpha=0.0)) == uniform
    assert objective_signature(LossStackSpec(preset="train_kappa_corrected", alpha=1.0)) != uniform
    token, base, mask = _batch(2)
    inputs = LossInputs(token_nll=token.detach(), base_nll=base, mask=mask)
    corrected = LossStackSpec(preset="train_kappa_corrected", alpha=0.0).build(train_kappa={0.0: 1.0})
    assert float(corrected(inputs).total) == pytest.approx(
        float(LossStackSpec(preset="uniform").build()(inputs).total), rel=1e-12)

"""The kl term's scale (per example or per target token), run-relative schedules, and beta in
ELBO units: each against an independent computation or a hand-worked case."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from objectives import TERMS, KLOptions, LossInputs, LossStackSpec, kl_anneal_factor, preset_spec
from objectives.schedules import (
    cycle_length,
    kl_schedule_overrun,
    ramp_overrun,
    total_optimizer_steps,
    warmup_length,
)
from objectives.units import (
    RECONSTRUCTION_TERMS,
    effective_beta,
    elbo_beta,
    elbo_beta_before_c_base,
)

C_BASE = 2.5


def _adversarial(seed: int, dims: int | None, dtype=torch.float64) -> LossInputs:
    """Ragged lengths 0..7, two empty rows whose token NLL is inf and KL is NaN or inf."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 1, 0, 3, 5, 0, 2, 6])
    mask = torch.arange(7)[None, :] < lengths[:, None]
    token = torch.rand(8, 7, generator=generator, dtype=torch.float64) * 6
    token = torch.where(mask, token, torch.tensor(float("inf"), dtype=torch.float64))
    shape = (8,) if dims is None else (8, dims)
    kl = torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    kl[2] = float("nan")
    kl[5] = float("inf")
    return LossInputs(token_nll=token.to(dtype).requires_grad_(), base_nll=torch.ones(8, 7, dtype=dtype),
                      mask=mask, kl=kl.to(dtype).requires_grad_())


def _reference(inputs: LossInputs, options: dict) -> float:
    """The kl term by hand: Python floats and math.fsum, no torch reduction."""
    mask = inputs.mask.tolist()
    kl = inputs.kl.detach().double().tolist()
    rows = [b for b, row in enumerate(mask) if any(row)]
    n = {b: sum(mask[b]) for b in rows}
    per_dim = {b: kl[b] if isinstance(kl[b], list) else [kl[b]] for b in rows}
    lam = options.get("free_bits", 0.0)
    token = options.get("scale") == "token"
    weight = {b: (1.0 / n[b] if token else 1.0) / len(rows) for b in rows}
    if options.get("free_bits_mode") == "dimension":
        dims = len(per_dim[rows[0]])
        floor = lam * math.fsum(weight.values())
        means = [math.fsum(weight[b] * per_dim[b][d] for b in rows) for d in range(dims)]
        return math.fsum(max(floor, m) for m in means)
    return math.fsum(weight[b] * max(lam, math.fsum(per_dim[b])) for b in rows)


CASES = [
    ({"scale": "token"}, None),
    ({"scale": "token"}, 3),
    ({"scale": "token", "free_bits": 0.8}, None),
    ({"scale": "token", "free_bits": 0.8}, 3),
    ({"scale": "token", "free_bits": 0.4, "free_bits_mode": "dimension"}, 3),
    ({"scale": "token", "free_bits": 5.0, "free_bits_mode": "dimension"}, 2),
    ({"scale": "example", "free_bits": 0.8}, 3),
    ({"scale": "example", "free_bits": 0.4, "free_bits_mode": "dimension"}, 3),
]


@pytest.mark.parametrize(("options", "dims"), CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kl_scale_matches_the_hand_computation_on_ragged_and_empty_rows(options, dims, dtype):
    inputs = _adversarial(seed=len(str(options)) + (dims or 0), dims=dims, dtype=dtype)
    out = LossStackSpec(terms={"uniform": 1.0, "kl": {"weight": 0.7, "options": options}}).build()(inputs)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-6
    assert float(out.terms["kl"].detach()) == pytest.approx(_reference(inputs, options), rel=tolerance)
    out.total.backward()
    assert torch.isfinite(inputs.kl.grad).all() and torch.isfinite(inputs.token_nll.grad).all()
    assert (inputs.kl.grad[~inputs.mask.any(-1)] == 0).all()  # empty rows: excluded


def test_per_token_kl_gradient_is_the_example_weight_over_its_length():
    inputs = _adversarial(seed=3, dims=None)
    LossStackSpec(terms={"kl": {"weight": 2.0, "options": {"scale": "token"}}}).build()(inputs).total.backward()
    lengths = inputs.mask.sum(-1).double()
    active = lengths > 0
    expected = torch.where(active, 2.0 / (active.sum() * lengths.clamp_min(1)), 0.0)
    torch.testing.assert_close(inputs.kl.grad, expected)


def test_free_bits_stay_in_nats_per_example_under_the_per_token_scale():
    # Row 0 (KL 0.5 < lambda = 1) is free under both scales; row 1 (KL 3) pays 3/n per token.
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    kl = torch.tensor([0.5, 3.0], dtype=torch.float64, requires_grad=True)
    inputs = LossInputs(token_nll=torch.ones(2, 4, dtype=torch.float64),
                        base_nll=torch.ones(2, 4, dtype=torch.float64), mask=mask, kl=kl)
    out = LossStackSpec(terms={"kl": {"options": {"scale": "token", "free_bits": 1.0}}}).build()(inputs)
    assert float(out.terms["kl"].detach()) == pytest.approx((1.0 / 4 + 3.0 / 2) / 2, rel=1e-12)
    out.total.backward()
    torch.testing.assert_close(kl.grad, torch.tensor([0.0, 0.25], dtype=torch.float64))


@pytest.mark.parametrize("options", [{}, {"free_bits": 0.6}, {"free_bits": 0.3, "free_bits_mode": "dimension"},
                                     {"free_bits": 3.0, "free_bits_mode": "dimension"}])
def test_on_equal_lengths_the_per_token_kl_is_the_per_example_kl_over_n(options):
    generator = torch.Generator().manual_seed(4)
    kl = torch.rand(6, 3, generator=generator, dtype=torch.float64)
    mask = torch.zeros(6, 9, dtype=torch.bool)
    mask[:, :5] = True
    inputs = LossInputs(token_nll=torch.ones(6, 9, dtype=torch.float64),
                        base_nll=torch.ones(6, 9, dtype=torch.float64), mask=mask, kl=kl)

    def value(scale):
        spec = LossStackSpec(terms={"kl": {"options": {**options, "scale": scale}}})
        return float(spec.build()(inputs).terms["kl"])

    assert value("token") == pytest.approx(value("example") / 5, rel=1e-12)


def test_uniform_plus_per_token_kl_is_the_mean_of_elbo_over_length():
    """With `uniform`, the loss is mean_x (sum_t l_t + beta KL_x) / n_x: one beta, any length."""
    inputs = _adversarial(seed=5, dims=None)
    beta = 0.37
    out = LossStackSpec(terms={"uniform": 1.0, "kl": {"weight": beta, "options": {"scale": "token"}}}
                        ).build()(inputs)
    mask, token, kl = inputs.mask.tolist(), inputs.token_nll.tolist(), inputs.kl.tolist()
    rows = [b for b in range(8) if any(mask[b])]
    per_example = [(math.fsum(t for t, m in zip(token[b], mask[b], strict=True) if m) + beta * kl[b])
                   / sum(mask[b]) for b in rows]
    assert float(out.total.detach()) == pytest.approx(math.fsum(per_example) / len(rows), rel=1e-12)


def test_the_default_scale_is_per_example_and_unchanged():
    assert KLOptions().scale == "example"
    kl = torch.tensor([0.2, 3.0, 0.9], dtype=torch.float64)
    mask = torch.tensor([[True] * 3, [True, False, False], [True, True, False]])
    inputs = LossInputs(token_nll=torch.ones(3, 3, dtype=torch.float64),
                        base_nll=torch.ones(3, 3, dtype=torch.float64), mask=mask, kl=kl)
    out = LossStackSpec(terms={"kl": {"options": {"free_bits": 1.0}}}).build()(inputs)
    assert float(out.terms["kl"].detach()) == pytest.approx((1.0 + 3.0 + 1.0) / 3, rel=1e-12)


# --------------------------------------------------------------------------- schedules


def test_total_optimizer_steps_counts_the_smaller_last_batch():
    assert total_optimizer_steps(3, 577, 32) == 57  # the first real-text study: 3 x 19
    assert total_optimizer_steps(8, 2048, 64) == 256
    assert total_optimizer_steps(1, 1, 64) == 1


@pytest.mark.parametrize(("options", "total", "warmup", "cycle"), [
    ({"warmup_fraction": 0.5}, 57, 29, 1000.0),  # 28.5 rounds up
    ({"warmup_fraction": 0.1}, 570, 57, 1000.0),
    ({"warmup_fraction": 0.001}, 57, 1, 1000.0),  # at least one step
    ({"cycles": 4}, 57, 1000, 14.25),
    ({"warmup_steps": 30, "cycle_steps": 20}, 57, 30, 20.0),
    ({}, 57, 1000, 1000.0),
])
def test_run_relative_lengths_resolve_to_steps(options, total, warmup, cycle):
    kl = KLOptions(**options)
    assert warmup_length(kl, total) == warmup
    assert cycle_length(kl, total) == cycle


def test_the_stack_resolves_fractions_with_its_total_steps():
    spec = LossStackSpec(terms={"uniform": 1.0, "kl": {"weight": 2.0, "options": {
        "anneal": "linear", "warmup_fraction": 0.5}}})
    stack = spec.build(total_steps=57)
    assert stack.weights_at(0)["kl"] == 0.0
    assert stack.weights_at(29)["kl"] == pytest.approx(2.0)
    assert stack.weights_at(14)["kl"] == pytest.approx(2.0 * 14 / 29)
    with pytest.raises(ValueError, match="total_steps"):
        spec.build()


def test_cycles_end_with_the_run():
    options = KLOptions(anneal="cyclical", cycles=4, cycle_ratio=0.5)
    # Cycles of 14.25 steps: step 57 would start a fifth; 14.25 and 28.5 start the 2nd and 3rd.
    assert kl_anneal_factor(options, 0, 57) == 0.0
    assert kl_anneal_factor(options, 7, 57) == pytest.approx(7 / 7.125)
    assert kl_anneal_factor(options, 15, 57) == pytest.approx(0.75 / 7.125)
    assert kl_anneal_factor(options, 56, 57) == 1.0


@pytest.mark.parametrize(("options", "field"), [
    ({"warmup_steps": 100, "warmup_fraction": 0.3}, "warmup_fraction"),
    ({"cycle_steps": 100, "cycles": 3}, "cycles"),
])
def test_steps_and_fraction_together_are_refused_naming_both(options, field):
    with pytest.raises(ValidationError, match="not both") as error:
        LossStackSpec(terms={"kl": {"options": options}})
    assert field in str(error.value) and error.value.errors()[0]["loc"] == ("terms", "kl", "options")


@pytest.mark.parametrize(("options", "total", "overrun"), [
    ({"anneal": "linear"}, 57, "KL warm-up of 1000 steps"),  # the default, silently long before
    ({"anneal": "linear", "warmup_steps": 56}, 57, None),
    ({"anneal": "linear", "warmup_steps": 57}, 57, "KL warm-up of 57 steps"),
    ({"anneal": "linear", "warmup_fraction": 0.5}, 57, None),
    ({"anneal": "linear", "warmup_fraction": 1.0}, 57, "KL warm-up of 57 steps"),
    ({"anneal": "cyclical"}, 57, "KL cycles of 1000 steps (not one whole cycle)"),
    ({"anneal": "cyclical", "cycle_steps": 25}, 57, "KL cycles of 25 steps (the run ends inside a ramp)"),
    ({"anneal": "cyclical", "cycle_steps": 19}, 57, None),
    ({"anneal": "cyclical", "cycles": 4}, 57, None),
    ({"anneal": "none"}, 57, None),
])
def test_schedules_that_do_not_finish_within_the_run_are_named(options, total, overrun):
    assert kl_schedule_overrun(KLOptions(**options), total) == overrun


def test_a_ramp_finishes_when_its_end_is_a_step_the_run_takes():
    assert ramp_overrun("Gumbel temperature decay", 2000, 57) == "Gumbel temperature decay of 2000 steps"
    assert ramp_overrun("Gumbel temperature decay", 56, 57) is None


# --------------------------------------------------------------------------- ELBO units


@pytest.mark.parametrize(("preset", "scale", "expected"), [
    ("uniform", "example", 0.5 * 21),
    ("raw_token_weighted", "example", 0.5 * 21),
    ("ncc", "example", 0.5 * 21 * C_BASE),
    ("normalized_uniform", "example", 0.5 * 21 * C_BASE),
    ("raw_plus_ncc", "example", 0.5 * 21 / (1 + 1 / C_BASE)),
    ("uniform", "token", 0.5),
    ("ncc", "token", 0.5 * C_BASE),
])
def test_beta_in_elbo_units(preset, scale, expected):
    stack = preset_spec(preset, alpha=1.0, terms={"kl": {"weight": 0.5, "options": {"scale": scale}}})
    assert elbo_beta(stack, C_BASE, 21.0) == pytest.approx(expected, rel=1e-12)
    assert effective_beta(stack, C_BASE) * (21.0 if scale == "example" else 1.0) == pytest.approx(expected)


def test_every_term_but_the_kl_and_the_auxiliary_one_counts_as_reconstruction():
    assert set(TERMS) - {"kl", "bag_of_words"} == RECONSTRUCTION_TERMS


def test_beta_in_elbo_units_before_c_base_is_known():
    def before(preset, scale="example", length=21.0):
        stack = preset_spec(preset, terms={"kl": {"weight": 0.5, "options": {"scale": scale}}})
        return elbo_beta_before_c_base(stack, length, "the dataset is not readable").describe()

    assert before("uniform") == "10.5"
    assert before("ncc") == "10.5 x c_base"
    assert before("raw_plus_ncc").startswith("unknown (needs c_base")
    assert before("uniform", length=None) == "unknown (the dataset is not readable)"
    assert before("uniform", scale="token", length=None) == "0.5"
    assert elbo_beta_before_c_base(preset_spec("uniform"), 21.0).describe() == "unknown (the stack has no kl term)"


def test_the_mutual_information_credit_follows_the_scale():
    """Per token, each example's share KL(q_b || mean q) of I is divided by its n_b, as its KL is."""
    generator = torch.Generator().manual_seed(8)
    inputs = _adversarial(seed=8, dims=None)
    probs = torch.softmax(torch.randn(8, 3, generator=generator, dtype=torch.float64), dim=-1)
    probs[2] = float("nan")  # an empty row's posterior: weight 0, no NaN
    inputs.posterior_probs = probs.requires_grad_()
    options = {"scale": "token", "free_bits": 0.2, "mutual_info_credit": 0.6}
    out = LossStackSpec(terms={"kl": {"options": options}}).build()(inputs)
    mask, q = inputs.mask.tolist(), probs.detach().tolist()
    rows = [b for b in range(8) if any(mask[b])]
    mean_q = [math.fsum(q[b][k] for b in rows) / len(rows) for k in range(3)]
    shares = [math.fsum(q[b][k] * math.log(q[b][k] / mean_q[k]) for k in range(3)) / sum(mask[b])
              for b in rows]
    expected = _reference(inputs, options) - 0.6 * math.fsum(shares) / len(rows)
    assert float(out.terms["kl"].detach()) == pytest.approx(expected, rel=1e-12)
    out.total.backward()
    assert torch.isfinite(probs.grad[[b for b in range(8) if b != 2 and b != 5]]).all()


def test_with_the_credit_the_per_token_term_on_equal_lengths_is_the_per_example_term_over_n():
    generator = torch.Generator().manual_seed(9)
    mask = torch.zeros(6, 9, dtype=torch.bool)
    mask[:, :4] = True
    probs = torch.softmax(torch.randn(6, 4, generator=generator, dtype=torch.float64), dim=-1)
    inputs = LossInputs(token_nll=torch.ones(6, 9, dtype=torch.float64), base_nll=torch.ones(6, 9, dtype=torch.float64),
                        mask=mask, kl=torch.rand(6, generator=generator, dtype=torch.float64),
                        posterior_probs=probs)

    def value(scale):
        spec = LossStackSpec(terms={"kl": {"options": {"scale": scale, "mutual_info_credit": 1.0}}})
        return float(spec.build()(inputs).terms["kl"])

    assert value("token") == pytest.approx(value("example") / 4, rel=1e-12)


@pytest.mark.parametrize(("preset", "scale"), [
    ("uniform", 1.0), ("raw_token_weighted", 1.0), ("ncc", 1 / 5.0), ("normalized_uniform", 1 / 5.0),
    ("raw_plus_ncc", 1 + 1 / 5.0)])
def test_an_effective_weight_trains_at_beta_times_the_reconstruction_scale(preset, scale):
    from objectives.units import (
        effective_beta,
        elbo_beta,
        elbo_beta_before_c_base,
        trained_kl_weight,
    )

    kl = {"weight": 0.3, "options": {"weight_units": "effective"}}
    stack = LossStackSpec(preset=preset, alpha=1.0, terms={"kl": kl})
    assert trained_kl_weight(stack, 5.0) == pytest.approx(0.3 * scale, rel=1e-12)
    assert stack.build(c_base=5.0).weights_at(0)["kl"] == pytest.approx(0.3 * scale, rel=1e-12)
    assert effective_beta(stack, 5.0) == pytest.approx(0.3, rel=1e-12)
    assert elbo_beta(stack, 5.0, 12.0) == pytest.approx(0.3 * 12.0, rel=1e-12)
    assert elbo_beta_before_c_base(stack, 12.0).value == pytest.approx(0.3 * 12.0, rel=1e-12)
    # The same stack with the weight as beta trains at 0.3 and sits at effective beta 0.3 / S.
    plain = LossStackSpec(preset=preset, alpha=1.0, terms={"kl": {"weight": 0.3}})
    assert plain.build(c_base=5.0).weights_at(0)["kl"] == pytest.approx(0.3, rel=1e-12)
    assert effective_beta(plain, 5.0) == pytest.approx(0.3 / scale, rel=1e-12)


def test_an_effective_weight_on_a_normalized_stack_needs_c_base():
    from objectives.units import trained_kl_weight

    stack = LossStackSpec(preset="ncc", terms={"kl": {"weight": 1.0, "options": {"weight_units": "effective"}}})
    with pytest.raises(ValueError, match="needs c_base"):
        trained_kl_weight(stack, None)

"""Loss stacks: presets, the declarative spec, its validation, and the kl / bag_of_words terms."""

from __future__ import annotations

import json
import math

import pytest
import torch

from objectives import (
    PRESETS,
    TERMS,
    KLOptions,
    LossInputs,
    LossStackSpec,
    describe_presets,
    describe_terms,
    kl_anneal_factor,
    normalized_concentration_corrected_reconstruction,
    normalized_concentration_corrected_token_weighted_reconstruction_loss,
    preset_spec,
    token_weighted_reconstruction,
)

C_BASE = 2.5
TOL = dict(rtol=1e-9, atol=1e-12)


def _inputs(seed: int = 0, dtype=torch.float64, **extra) -> LossInputs:
    generator = torch.Generator().manual_seed(seed)
    base = torch.rand(5, 7, generator=generator, dtype=torch.float64) * 8
    base[0, 1] = 0.0
    base[2] = 0.0
    token = torch.rand(5, 7, generator=generator, dtype=torch.float64) * 8
    mask = torch.rand(5, 7, generator=generator) < 0.7
    mask[0] = True
    mask[2, :3] = True
    mask[3] = False  # an empty row: left out of every batch mean
    base = torch.where(mask, base, torch.tensor(float("nan"), dtype=torch.float64))
    token = torch.where(mask, token, torch.tensor(float("inf"), dtype=torch.float64))
    return LossInputs(token_nll=token.to(dtype), base_nll=base.to(dtype), mask=mask, **extra)


TRAIN_KAPPA = {0.0: 1.0, 1.0: 1.37, 2.5: 2.21}  # a train split's mean kappa per alpha, for train_kappa_corrected


def _active_mean(per_example: torch.Tensor, mask: torch.Tensor) -> float:
    active = mask.any(-1)
    return math.fsum(per_example[active].tolist()) / int(active.sum())


def _expected_term(ref, name: str, inputs: LossInputs, alpha: float, c_base: float | None) -> float:
    """The batch value of a reconstruction term from the independent reference."""
    token, base, mask = inputs.token_nll, inputs.base_nll, inputs.mask
    if name in ("uniform", "normalized_uniform"):
        values = ref.batch(base, mask, 0.0, token_nll=token)["r_tok"]
        return _active_mean(values, mask) / (c_base if name == "normalized_uniform" else 1.0)
    expected = ref.batch(base, mask, alpha, token_nll=token, c_base=c_base or 1.0)
    if name == "token_weighted":
        return _active_mean(expected["r_tok"], mask)
    if name == "concentration_corrected":
        return _active_mean(expected["r_tilde"], mask)
    if name == "train_kappa_corrected":
        return _active_mean(expected["r_tok"], mask) / TRAIN_KAPPA[alpha]
    if name == "normalized_concentration_corrected":
        assert c_base is not None
        return float(expected["loss"])
    raise AssertionError(f"no reference for term {name}")


def _assert_total_is_weighted_sum(out) -> None:
    expected = sum(out.weights[name] * float(value) for name, value in out.terms.items())
    assert float(out.total) == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.5])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_builds_runs_and_matches_reference(ref, preset, alpha):
    inputs = _inputs(seed=1)
    out = LossStackSpec(preset=preset, alpha=alpha).build(c_base=C_BASE, train_kappa=TRAIN_KAPPA)(inputs)
    described = {p["name"]: p for p in describe_presets()}[preset]
    assert set(out.terms) == set(described["terms"])
    assert out.total.shape == ()
    assert torch.isfinite(out.total)
    _assert_total_is_weighted_sum(out)
    for name, value in out.terms.items():
        assert float(value) == pytest.approx(
            _expected_term(ref, name, inputs, alpha, C_BASE), rel=1e-9
        ), name
    for name, term in described["terms"].items():
        assert out.weights[name] == pytest.approx(term.get("weight", 1.0))
    # Same through preset_spec, and through a c_base given in the spec itself.
    again = preset_spec(preset, alpha=alpha, c_base=C_BASE).build(train_kappa=TRAIN_KAPPA)(inputs)
    assert float(again.total) == pytest.approx(float(out.total), rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 3.0])
def test_raw_plus_ncc_is_mean_r_tok_plus_mean_r_hat(alpha):
    inputs = _inputs(seed=2)
    token, base, mask = inputs.token_nll, inputs.base_nll, inputs.mask
    out = preset_spec("raw_plus_ncc", alpha=alpha).build(c_base=C_BASE)(inputs)
    active = mask.any(-1)
    mean_r_tok = token_weighted_reconstruction(token, base, mask, alpha)[active].mean()
    mean_r_hat = normalized_concentration_corrected_reconstruction(
        token, base, mask, alpha, C_BASE
    )[active].mean()
    loss = normalized_concentration_corrected_token_weighted_reconstruction_loss(
        token, base, mask, alpha, C_BASE
    )
    torch.testing.assert_close(out.total, mean_r_tok + mean_r_hat, **TOL)
    torch.testing.assert_close(out.terms["token_weighted"], mean_r_tok, **TOL)
    torch.testing.assert_close(out.terms["normalized_concentration_corrected"], loss, **TOL)


def test_stack_gradient_flows_only_to_token_nll():
    inputs = _inputs(seed=3)
    token = torch.where(inputs.mask, inputs.token_nll, 0.0).requires_grad_(True)
    base = inputs.base_nll.clone().requires_grad_(True)
    stack = preset_spec("raw_plus_ncc", alpha=2.0).build(c_base=C_BASE)
    out = stack(LossInputs(token_nll=token, base_nll=base, mask=inputs.mask))
    out.total.backward()
    assert base.grad is None
    assert torch.isfinite(token.grad).all()
    assert (token.grad[~inputs.mask] == 0).all()


def test_off_mask_padding_does_not_leak_into_stack():
    inputs = _inputs(seed=4)
    token = inputs.token_nll.clone().requires_grad_(True)  # inf off the mask
    out = preset_spec("raw_plus_ncc", alpha=1.0).build(c_base=C_BASE)(
        LossInputs(token_nll=token, base_nll=inputs.base_nll, mask=inputs.mask)
    )
    out.total.backward()
    assert torch.isfinite(out.total)
    assert torch.isfinite(token.grad).all()


@pytest.mark.parametrize("preset", ["normalized_uniform", "ncc", "raw_plus_ncc"])
def test_normalized_stacks_without_c_base_raise(preset):
    with pytest.raises(ValueError, match="c_base"):
        LossStackSpec(preset=preset).build()(_inputs())


@pytest.mark.parametrize("terms", [{"normalized_concentration_corrected": 1.0},
                                   {"uniform": 1.0, "normalized_uniform": 0.5}])
def test_normalized_terms_without_c_base_raise(terms):
    with pytest.raises(ValueError, match="c_base"):
        LossStackSpec(terms=terms).build()(_inputs())


def test_unnormalized_stacks_need_no_c_base():
    for preset in ("uniform", "raw_token_weighted"):
        out = LossStackSpec(preset=preset).build()(_inputs())
        assert torch.isfinite(out.total)


@pytest.mark.parametrize("c_base", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_c_base_rejected(c_base):
    with pytest.raises(ValueError, match="c_base"):
        LossStackSpec(preset="ncc").build(c_base=c_base)(_inputs())
    with pytest.raises(ValueError, match="c_base"):
        LossStackSpec(preset="ncc", c_base=c_base).build()(_inputs())


def test_unknown_term_rejected_listing_valid_terms():
    with pytest.raises(ValueError, match="not_a_term") as info:
        LossStackSpec(terms={"not_a_term": 1.0})
    for name in TERMS:
        assert name in str(info.value)


def test_unknown_preset_rejected_listing_valid_presets():
    with pytest.raises(ValueError, match="nope") as info:
        LossStackSpec(preset="nope")
    for name in PRESETS:
        assert name in str(info.value)


def test_unknown_option_rejected_listing_valid_options():
    with pytest.raises(ValueError, match="temperature") as info:
        LossStackSpec(terms={"token_weighted": {"weight": 1.0, "options": {"temperature": 2}}})
    assert "alpha" in str(info.value)
    with pytest.raises(ValueError, match="free_bitz") as info:
        LossStackSpec(terms={"kl": {"weight": 1.0, "options": {"free_bitz": 0.1}}})
    for option in ("free_bits", "anneal"):
        assert option in str(info.value)
    with pytest.raises(ValueError, match="alpha"):
        LossStackSpec(terms={"uniform": {"weight": 1.0, "options": {"alpha": 1.0}}})


@pytest.mark.parametrize(
    "terms",
    [
        {"token_weighted": {"weight": 1.0, "options": {"alpha": -1.0}}},
        {"kl": {"weight": 1.0, "options": {"free_bits": -0.5}}},
        {"kl": {"weight": 1.0, "options": {"anneal": "exponential"}}},
        {"bag_of_words": {"weight": 1.0, "options": {"reduction": "max"}}},
        {"uniform": -1.0},
        {"uniform": float("nan")},
    ],
)
def test_invalid_option_and_weight_values_rejected(terms):
    with pytest.raises(ValueError):
        LossStackSpec(terms=terms)


@pytest.mark.parametrize("alpha", [-0.5, float("nan"), float("inf")])
def test_invalid_stack_alpha_rejected(alpha):
    with pytest.raises(ValueError, match="alpha"):
        LossStackSpec(preset="uniform", alpha=alpha)


def test_empty_stack_rejected():
    with pytest.raises(ValueError):
        LossStackSpec()


@pytest.mark.parametrize("weight", [0.5, 2, 1.25])
def test_float_shorthand_for_weights(weight):
    inputs = _inputs(seed=5)
    short = LossStackSpec(terms={"uniform": weight, "token_weighted": 1.0}, alpha=1.5).build()
    full = LossStackSpec(
        terms={"uniform": {"weight": weight}, "token_weighted": {"weight": 1.0}}, alpha=1.5
    ).build()
    a, b = short(inputs), full(inputs)
    assert a.weights["uniform"] == pytest.approx(weight)
    torch.testing.assert_close(a.total, b.total, rtol=0, atol=0)
    _assert_total_is_weighted_sum(a)


def test_spec_round_trips_through_json():
    spec = LossStackSpec(preset="raw_plus_ncc", alpha=2.0, terms={"kl": {"weight": 0.3}})
    again = LossStackSpec.model_validate(json.loads(spec.model_dump_json()))
    inputs = _inputs(seed=6, kl=torch.rand(5, dtype=torch.float64))
    torch.testing.assert_close(
        again.build(c_base=C_BASE)(inputs).total, spec.build(c_base=C_BASE)(inputs).total
    )


def test_preset_plus_extra_kl_term(ref):
    kl = torch.tensor([0.3, 1.2, 0.7, 9.0, 0.1], dtype=torch.float64)
    inputs = _inputs(seed=7, kl=kl)
    spec = LossStackSpec(preset="raw_plus_ncc", alpha=1.0, terms={"kl": {"weight": 0.25}})
    out = spec.build(c_base=C_BASE)(inputs)
    assert set(out.terms) == {"token_weighted", "normalized_concentration_corrected", "kl"}
    expected_kl = float(kl[inputs.mask.any(-1)].mean())  # row 3 is empty
    assert float(out.terms["kl"]) == pytest.approx(expected_kl, rel=1e-12)
    expected = (
        _expected_term(ref, "token_weighted", inputs, 1.0, C_BASE)
        + _expected_term(ref, "normalized_concentration_corrected", inputs, 1.0, C_BASE)
        + 0.25 * expected_kl
    )
    assert float(out.total) == pytest.approx(expected, rel=1e-9)
    assert out.weights["kl"] == pytest.approx(0.25)


def test_terms_override_preset_weight():
    inputs = _inputs(seed=8)
    out = LossStackSpec(preset="raw_plus_ncc", terms={"token_weighted": 0.5}).build(
        c_base=C_BASE
    )(inputs)
    assert out.weights["token_weighted"] == pytest.approx(0.5)
    assert out.weights["normalized_concentration_corrected"] == pytest.approx(1.0)
    _assert_total_is_weighted_sum(out)


def test_zero_weight_term_is_reported_but_not_in_total(ref):
    inputs = _inputs(seed=9)
    out = LossStackSpec(
        terms={"uniform": 1.0, "token_weighted": 0.0, "concentration_corrected": {"weight": 0}},
        alpha=2.0,
    ).build()(inputs)
    assert set(out.terms) == {"uniform", "token_weighted", "concentration_corrected"}
    assert out.weights["token_weighted"] == 0.0
    assert out.weights["concentration_corrected"] == 0.0
    uniform = _expected_term(ref, "uniform", inputs, 2.0, None)
    assert float(out.total) == pytest.approx(uniform, rel=1e-9)
    assert float(out.terms["token_weighted"]) == pytest.approx(
        _expected_term(ref, "token_weighted", inputs, 2.0, None), rel=1e-9
    )


def test_zero_weight_term_does_not_poison_total_or_gradient():
    inputs = _inputs(seed=9, kl=torch.tensor([float("inf")] * 5, dtype=torch.float64))
    token = torch.where(inputs.mask, inputs.token_nll, 0.0).requires_grad_(True)
    inputs.token_nll = token
    out = LossStackSpec(terms={"uniform": 1.0, "kl": 0.0}).build()(inputs)
    assert "kl" in out.terms and out.weights["kl"] == 0.0
    assert torch.isfinite(out.total)
    out.total.backward()
    assert torch.isfinite(token.grad).all()


def test_float32_stack_matches_reference(ref):
    inputs = _inputs(seed=12, dtype=torch.float32)
    out = preset_spec("raw_plus_ncc", alpha=4.0).build(c_base=C_BASE)(inputs)
    assert out.total.dtype == torch.float32
    for name, value in out.terms.items():
        assert float(value) == pytest.approx(
            _expected_term(ref, name, inputs, 4.0, C_BASE), rel=1e-5
        ), name


def test_term_alpha_option_overrides_stack_alpha(ref):
    inputs = _inputs(seed=10)
    out = LossStackSpec(
        alpha=1.0,
        terms={
            "token_weighted": {"weight": 1.0, "options": {"alpha": 3.0}},
            "normalized_concentration_corrected": 1.0,
            "concentration_corrected": {"weight": 1.0, "options": {"alpha": 0.0}},
        },
    ).build(c_base=C_BASE)(inputs)
    assert float(out.terms["token_weighted"]) == pytest.approx(
        _expected_term(ref, "token_weighted", inputs, 3.0, C_BASE), rel=1e-9
    )
    assert float(out.terms["normalized_concentration_corrected"]) == pytest.approx(
        _expected_term(ref, "normalized_concentration_corrected", inputs, 1.0, C_BASE), rel=1e-9
    )
    assert float(out.terms["concentration_corrected"]) == pytest.approx(
        _expected_term(ref, "uniform", inputs, 0.0, C_BASE), rel=1e-9
    )


def test_stack_rejects_bad_inputs():
    inputs = _inputs()
    stack = LossStackSpec(preset="uniform").build()
    with pytest.raises(ValueError, match="mask"):
        stack(LossInputs(inputs.token_nll, inputs.base_nll, inputs.mask.int()))
    with pytest.raises(ValueError, match="token_nll|base_nll"):
        stack(LossInputs(inputs.token_nll[:, :-1], inputs.base_nll, inputs.mask))


# --------------------------------------------------------------------------- kl

KL_PER_DIM = torch.tensor([[0.1, 0.2], [1.0, 0.5], [0.0, 0.05]], dtype=torch.float64)


def _kl_inputs(kl: torch.Tensor, step: int = 0) -> LossInputs:
    token = torch.ones(3, 2, dtype=torch.float64)
    return LossInputs(
        token_nll=token, base_nll=token.clone(), mask=torch.ones(3, 2, dtype=torch.bool),
        kl=kl, step=step,
    )


def _kl_value(options: dict, kl: torch.Tensor, weight: float = 1.0, step: int = 0):
    spec = LossStackSpec(terms={"kl": {"weight": weight, "options": options}})
    return spec.build()(_kl_inputs(kl, step))


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, (0.3 + 1.5 + 0.05) / 3),
        ({"free_bits": 0.3}, (0.3 + 1.5 + 0.3) / 3),
        ({"free_bits": 0.5, "free_bits_mode": "example"}, (0.5 + 1.5 + 0.5) / 3),
        ({"free_bits": 2.0}, 2.0),
        # Per dimension: sum_d max(lambda, mean_b KL_bd); the means are 1.1/3 and 0.25.
        ({"free_bits": 0.3, "free_bits_mode": "dimension"}, 1.1 / 3 + 0.3),
        ({"free_bits": 0.5, "free_bits_mode": "dimension"}, 0.5 + 0.5),
        ({"free_bits": 0.1, "free_bits_mode": "dimension"}, 1.1 / 3 + 0.25),
        ({"free_bits_mode": "dimension"}, 1.1 / 3 + 0.25),
    ],
)
def test_kl_free_bits(options, expected):
    out = _kl_value(options, KL_PER_DIM)
    assert float(out.terms["kl"]) == pytest.approx(expected, rel=1e-12)
    assert float(out.total) == pytest.approx(expected, rel=1e-12)


def test_kl_per_example_vector_with_free_bits():
    kl = torch.tensor([0.2, 3.0, 0.9], dtype=torch.float64)
    out = _kl_value({"free_bits": 1.0}, kl, weight=0.5)
    assert float(out.terms["kl"]) == pytest.approx((1.0 + 3.0 + 1.0) / 3, rel=1e-12)
    assert float(out.total) == pytest.approx(0.5 * 5.0 / 3, rel=1e-12)


def test_kl_gradient_respects_free_bits():
    kl = torch.tensor([[0.1, 0.2], [1.0, 0.5], [0.0, 0.05]], dtype=torch.float64,
                      requires_grad=True)
    _kl_value({"free_bits": 0.5}, kl).total.backward()
    # Rows 0 and 2 are below the free bits (constant); row 1 contributes 1/3 per dimension.
    expected = torch.tensor([[0, 0], [1 / 3, 1 / 3], [0, 0]], dtype=torch.float64)
    torch.testing.assert_close(kl.grad, expected)


@pytest.mark.parametrize(
    ("options", "step", "expected"),
    [
        ({"anneal": "none"}, 0, 1.0),
        ({"anneal": "none"}, 12345, 1.0),
        ({"anneal": "linear", "warmup_steps": 1000}, 0, 0.0),
        ({"anneal": "linear", "warmup_steps": 1000}, 250, 0.25),
        ({"anneal": "linear", "warmup_steps": 1000}, 1000, 1.0),
        ({"anneal": "linear", "warmup_steps": 1000}, 5000, 1.0),
        ({"anneal": "linear", "warmup_steps": 100, "anneal_start": 0.2}, 0, 0.2),
        ({"anneal": "linear", "warmup_steps": 100, "anneal_start": 0.2}, 50, 0.6),
        ({"anneal": "linear", "warmup_steps": 100, "anneal_start": 0.2}, 100, 1.0),
        ({"anneal": "cyclical", "cycle_steps": 100, "cycle_ratio": 0.5}, 0, 0.0),
        ({"anneal": "cyclical", "cycle_steps": 100, "cycle_ratio": 0.5}, 25, 0.5),
        ({"anneal": "cyclical", "cycle_steps": 100, "cycle_ratio": 0.5}, 50, 1.0),
        ({"anneal": "cyclical", "cycle_steps": 100, "cycle_ratio": 0.5}, 80, 1.0),
        ({"anneal": "cyclical", "cycle_steps": 100, "cycle_ratio": 0.5}, 100, 0.0),
        ({"anneal": "cyclical", "cycle_steps": 100, "cycle_ratio": 0.5}, 110, 0.2),
        ({"anneal": "cyclical", "cycle_steps": 100, "cycle_ratio": 0.5}, 225, 0.5),
        ({"anneal": "cyclical", "cycle_steps": 40, "cycle_ratio": 1.0}, 30, 0.75),
        (
            {"anneal": "cyclical", "cycle_steps": 100, "cycle_ratio": 0.25, "anneal_start": 0.5},
            110,
            0.7,
        ),
    ],
)
def test_kl_anneal_factor(options, step, expected):
    assert kl_anneal_factor(KLOptions(**options), step) == pytest.approx(expected, abs=1e-12)
    # The factor scales the effective weight (beta) reported by the stack and used in total.
    out = _kl_value(options, KL_PER_DIM, weight=2.0, step=step)
    assert out.weights["kl"] == pytest.approx(2.0 * expected, abs=1e-12)
    assert float(out.terms["kl"]) == pytest.approx(1.85 / 3, rel=1e-12)
    assert float(out.total) == pytest.approx(2.0 * expected * 1.85 / 3, rel=1e-12, abs=1e-12)


def test_missing_kl_raises_naming_kl():
    inputs = _inputs()
    stack = LossStackSpec(preset="uniform", terms={"kl": 1.0}).build()
    with pytest.raises(ValueError, match="kl"):
        stack(inputs)


def test_missing_bag_of_words_inputs_raise():
    inputs = _inputs()
    stack = LossStackSpec(terms={"bag_of_words": 1.0}).build()
    with pytest.raises(ValueError, match="bow_logits|targets"):
        stack(inputs)


# --------------------------------------------------------------------------- bag of words

BOW_LOGITS = [[2.0, 0.5, -1.0, 0.0], [0.0, 0.0, 0.0, 3.0], [1.0, -2.0, 0.5, 0.25]]
BOW_TARGETS = [[0, 2, 2, 3], [3, 1, 0, 0], [1, 1, 3, 2]]
BOW_MASK = [[True, True, True, False], [True, True, False, False], [False, False, False, False]]


def _bow_reference(reduction: str) -> float:
    per_example = []
    for logits, targets, mask in zip(BOW_LOGITS, BOW_TARGETS, BOW_MASK, strict=True):
        log_z = math.log(math.fsum(math.exp(v) for v in logits))
        nll = [log_z - logits[t] for t, m in zip(targets, mask, strict=True) if m]
        if not nll:
            continue  # an example with no active token is left out of the batch mean
        per_example.append(math.fsum(nll) / (len(nll) if reduction == "mean" else 1))
    return math.fsum(per_example) / len(per_example)


def _bow_inputs(dtype) -> LossInputs:
    mask = torch.tensor(BOW_MASK)
    token = torch.ones(3, 4, dtype=dtype)
    return LossInputs(
        token_nll=token, base_nll=token.clone(), mask=mask,
        bow_logits=torch.tensor(BOW_LOGITS, dtype=dtype),
        targets=torch.tensor(BOW_TARGETS, dtype=torch.int64),
    )


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_bag_of_words_against_hand_computation(reduction):
    inputs = _bow_inputs(torch.float32)
    out = LossStackSpec(
        terms={"bag_of_words": {"weight": 0.5, "options": {"reduction": reduction}}}
    ).build()(inputs)
    expected = _bow_reference(reduction)
    assert float(out.terms["bag_of_words"]) == pytest.approx(expected, rel=1e-5)
    assert float(out.total) == pytest.approx(0.5 * expected, rel=1e-5)


def test_bag_of_words_default_reduction_is_mean():
    out = LossStackSpec(terms={"bag_of_words": 1.0}).build()(_bow_inputs(torch.float32))
    assert float(out.terms["bag_of_words"]) == pytest.approx(_bow_reference("mean"), rel=1e-5)


def test_bag_of_words_gradient_only_from_active_targets():
    inputs = _bow_inputs(torch.float32)
    logits = inputs.bow_logits.clone().requires_grad_(True)
    inputs.bow_logits = logits
    LossStackSpec(terms={"bag_of_words": 1.0}).build()(inputs).total.backward()
    assert torch.isfinite(logits.grad).all()
    assert (logits.grad[2] == 0).all()  # the example with no active token


def test_bag_of_words_keeps_float64_precision():
    inputs = _bow_inputs(torch.float64)
    out = LossStackSpec(terms={"bag_of_words": 1.0}).build()(inputs)
    assert float(out.terms["bag_of_words"]) == pytest.approx(_bow_reference("mean"), rel=1e-12)


# --------------------------------------------------------------------------- descriptions


def test_describe_terms_and_presets_are_json_serialisable():
    terms = json.loads(json.dumps(describe_terms()))
    presets = json.loads(json.dumps(describe_presets()))
    assert {t["name"] for t in terms} == set(TERMS)
    assert {p["name"] for p in presets} == set(PRESETS)
    required = {
        "uniform", "normalized_uniform", "token_weighted", "concentration_corrected",
        "normalized_concentration_corrected", "kl", "bag_of_words",
    }
    assert required <= set(TERMS)
    for preset in presets:
        assert set(preset["terms"]) <= set(TERMS)

"""Every ValueError of the objective functions, and what validate=True does (and does not) check."""

from __future__ import annotations

import math

import pytest
import torch

from objectives import (
    ReferenceScale,
    concentration_corrected_reconstruction,
    normalized_concentration_corrected_reconstruction,
    normalized_concentration_corrected_token_weighted_reconstruction_loss,
    token_weight_stats,
    token_weighted_reconstruction,
    uniform_reconstruction,
)

B, T = 3, 4


def _batch(dtype=torch.float64):
    base = torch.arange(1, B * T + 1, dtype=dtype).reshape(B, T) / 3
    token = base.flip(-1).clone()
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[2, 1:] = False
    return token, base, mask


# Each callable takes (token_nll, base_nll, mask, alpha, c_base) and passes what it needs.
FUNCTIONS = {
    "token_weight_stats": lambda t, b, m, a, c, **kw: token_weight_stats(b, m, a, **kw),
    "token_weighted_reconstruction": lambda t, b, m, a, c, **kw: token_weighted_reconstruction(
        t, b, m, a, **kw
    ),
    "concentration_corrected_reconstruction": lambda t, b, m, a, c, **kw: (
        concentration_corrected_reconstruction(t, b, m, a, **kw)
    ),
    "normalized_concentration_corrected_reconstruction": lambda t, b, m, a, c, **kw: (
        normalized_concentration_corrected_reconstruction(t, b, m, a, c, **kw)
    ),
    "loss": lambda t, b, m, a, c, **kw: (
        normalized_concentration_corrected_token_weighted_reconstruction_loss(t, b, m, a, c, **kw)
    ),
}
WITH_TOKEN = [name for name in FUNCTIONS if name != "token_weight_stats"]
WITH_C_BASE = ["normalized_concentration_corrected_reconstruction", "loss"]


@pytest.mark.parametrize("alpha", [-1.0, -1e-12, -20, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_bad_alpha_raises_naming_alpha(name, alpha):
    token, base, mask = _batch()
    with pytest.raises(ValueError, match="alpha"):
        FUNCTIONS[name](token, base, mask, alpha, 1.0)


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.int32, torch.uint8, torch.float32])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_non_bool_mask_raises_naming_mask(name, mask_dtype):
    token, base, mask = _batch()
    with pytest.raises(ValueError, match="mask"):
        FUNCTIONS[name](token, base, mask.to(mask_dtype), 1.0, 1.0)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_mask_shape_mismatch_raises_naming_mask(name):
    token, base, mask = _batch()
    for bad_mask in (mask[:, :-1], mask[:-1], torch.ones(B, T + 1, dtype=torch.bool)):
        with pytest.raises(ValueError, match="mask"):
            FUNCTIONS[name](token, base, bad_mask, 1.0, 1.0)


@pytest.mark.parametrize("name", WITH_TOKEN)
def test_token_nll_shape_mismatch_raises(name):
    token, base, mask = _batch()
    for bad_token in (token[:, :-1], token[:-1], torch.zeros(B, T + 2, dtype=torch.float64),
                      token.T.contiguous()):
        with pytest.raises(ValueError, match="token_nll|base_nll"):
            FUNCTIONS[name](bad_token, base, mask, 1.0, 1.0)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_non_2d_inputs_raise(name):
    token, base, mask = _batch()
    flat_t, flat_b, flat_m = token.reshape(-1), base.reshape(-1), mask.reshape(-1)
    with pytest.raises(ValueError, match="base_nll"):
        FUNCTIONS[name](flat_t, flat_b, flat_m, 1.0, 1.0)
    with pytest.raises(ValueError, match="base_nll"):
        FUNCTIONS[name](token[None], base[None], mask[None], 1.0, 1.0)
    with pytest.raises(ValueError, match="base_nll"):
        FUNCTIONS[name](token[0, 0], base[0, 0], mask[0, 0], 1.0, 1.0)


@pytest.mark.parametrize("name", WITH_TOKEN)
def test_non_2d_token_nll_raises(name):
    token, base, mask = _batch()
    with pytest.raises(ValueError, match="token_nll"):
        FUNCTIONS[name](token[None], base, mask, 1.0, 1.0)
    with pytest.raises(ValueError, match="token_nll"):
        FUNCTIONS[name](token.reshape(-1), base, mask, 1.0, 1.0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_non_float_base_nll_raises(name, dtype):
    token, base, mask = _batch()
    with pytest.raises(ValueError, match="base_nll"):
        FUNCTIONS[name](token, base.to(dtype), mask, 1.0, 1.0)


@pytest.mark.parametrize("c_base", [0.0, -0.0, -1.0, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", WITH_C_BASE)
def test_bad_c_base_raises_naming_c_base(name, c_base):
    token, base, mask = _batch()
    with pytest.raises(ValueError, match="c_base"):
        FUNCTIONS[name](token, base, mask, 1.0, c_base)


@pytest.mark.parametrize("bad", [-1.0, -1e-30, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_validate_catches_bad_base_nll_on_active_tokens(name, bad):
    token, base, mask = _batch()
    base = base.clone()
    base[1, 2] = bad
    with pytest.raises(ValueError, match="base_nll"):
        FUNCTIONS[name](token, base, mask, 1.0, 1.0, validate=True)
    # The default path checks no values (no host sync) and so does not raise.
    FUNCTIONS[name](token, base, mask, 1.0, 1.0)
    FUNCTIONS[name](token, base, mask, 1.0, 1.0, validate=False)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_validate_ignores_off_mask_padding(name, bad):
    token, base, mask = _batch()
    base = base.clone()
    base[2, 3] = bad  # off the mask
    token = token.clone()
    token[2, 2] = bad
    out = FUNCTIONS[name](token, base, mask, 1.0, 1.0, validate=True)
    values = out if isinstance(out, torch.Tensor) else torch.cat([v.reshape(-1).double() for v in out])
    assert torch.isfinite(values).all()


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_validate_accepts_valid_input_including_zeros(name):
    token, base, mask = _batch()
    base = base.clone()
    base[0] = 0.0
    FUNCTIONS[name](token, base, mask, 2.0, 1.0, validate=True)


def test_uniform_reconstruction_rejects_bad_arguments():
    token, _, mask = _batch()
    with pytest.raises(ValueError, match="mask"):
        uniform_reconstruction(token, mask.int())
    with pytest.raises(ValueError, match="mask"):
        uniform_reconstruction(token, mask[:, :-1])
    with pytest.raises(ValueError, match="token_nll"):
        uniform_reconstruction(token.long(), mask)


def test_reference_scale_rejects_bad_arguments():
    _, base, mask = _batch()
    scale = ReferenceScale()
    with pytest.raises(ValueError, match="mask"):
        scale.update(base, mask.int())
    with pytest.raises(ValueError, match="mask"):
        scale.update(base, mask[:, :-1])
    with pytest.raises(ValueError, match="base_nll"):
        scale.update(base.long(), mask)
    bad = base.clone()
    bad[0, 0] = -1.0
    with pytest.raises(ValueError, match="base_nll"):
        scale.update(bad, mask, validate=True)


def test_valid_edge_arguments_are_accepted():
    token, base, mask = _batch()
    # alpha may be a Python int, exactly 0, or large; c_base may be an int.
    for alpha in (0, 0.0, 1, 20, 20.0):
        value = normalized_concentration_corrected_reconstruction(token, base, mask, alpha, 2)
        assert torch.isfinite(value).all()
    assert math.isfinite(
        float(normalized_concentration_corrected_token_weighted_reconstruction_loss(
            token, base, mask, 1.0, 1e-6
        ))
    )

"""Argument checks shared by the objective functions.

Shape, dtype and device checks read only tensor metadata, so they cost no host
sync and always run. Checks that look at values (finiteness, sign) need a
device-to-host copy and run only when the caller passes ``validate=True``.
"""

from __future__ import annotations

import math
import numbers

import torch


def check_alpha(alpha: object) -> float:
    """Return ``alpha`` as a Python float, or raise ``ValueError`` naming it.

    A 0-d tensor is accepted and read once (a host sync, so prefer a float).
    """
    if isinstance(alpha, torch.Tensor):
        if alpha.numel() != 1:
            raise ValueError(f"alpha must be a scalar, got a tensor of shape {tuple(alpha.shape)}")
        alpha = alpha.item()
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise ValueError(f"alpha must be a real number >= 0, got {alpha!r}")
    value = float(alpha)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"alpha must be a finite real number >= 0, got {value!r}")
    return value


def check_c_base(c_base: object) -> float:
    """Return ``c_base`` as a Python float, or raise ``ValueError`` naming it."""
    if isinstance(c_base, torch.Tensor):
        if c_base.numel() != 1:
            raise ValueError(f"c_base must be a scalar, got a tensor of shape {tuple(c_base.shape)}")
        c_base = c_base.item()
    if isinstance(c_base, bool) or not isinstance(c_base, numbers.Real):
        raise ValueError(
            f"c_base must be a positive finite number (the mean over examples of b_u, "
            f"see ReferenceScale), got {c_base!r}"
        )
    value = float(c_base)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"c_base must be a positive finite number (the mean over examples of b_u, "
            f"see ReferenceScale), got {value!r}"
        )
    return value


def check_pair(base_nll: object, mask: object, name: str = "base_nll") -> None:
    """Check a float ``[B, T]`` tensor (called ``name``) and a bool ``mask`` of its shape and device."""
    if not isinstance(base_nll, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(base_nll).__name__}")
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a torch.Tensor of dtype torch.bool, got {type(mask).__name__}")
    if not base_nll.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {base_nll.dtype}")
    if base_nll.dim() != 2:
        raise ValueError(f"{name} must have shape [B, T], got shape {tuple(base_nll.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must have dtype torch.bool (True on active y-region tokens), got {mask.dtype}; "
            "convert with mask.bool()"
        )
    _check_like("mask", mask, name, base_nll)


def check_token_nll(token_nll: object, base_nll: torch.Tensor) -> None:
    """Check ``token_nll``: a float tensor with the shape and device of ``base_nll``."""
    if not isinstance(token_nll, torch.Tensor):
        raise ValueError(f"token_nll must be a torch.Tensor, got {type(token_nll).__name__}")
    if not token_nll.is_floating_point():
        raise ValueError(f"token_nll must be a floating-point tensor, got dtype {token_nll.dtype}")
    _check_like("token_nll", token_nll, "base_nll", base_nll)


def _check_like(name: str, tensor: torch.Tensor, reference_name: str, reference: torch.Tensor) -> None:
    """``tensor`` must have the shape and device of ``reference``."""
    if tensor.shape != reference.shape:
        raise ValueError(
            f"{name} must have the same shape as {reference_name}: {name} {tuple(tensor.shape)} "
            f"vs {reference_name} {tuple(reference.shape)}"
        )
    if tensor.device != reference.device:
        raise ValueError(f"{name} is on {tensor.device} but {reference_name} is on {reference.device}")


def check_values(base_nll: torch.Tensor, mask: torch.Tensor, token_nll: torch.Tensor | None) -> None:
    """Value checks behind ``validate=True`` (these synchronise with the device)."""
    active_base = base_nll.detach()[mask]
    bad = ~torch.isfinite(active_base)
    if bool(bad.any()):
        raise ValueError(
            f"base_nll must be finite on active tokens; found {int(bad.sum())} non-finite value(s)"
        )
    negative = active_base < 0
    if bool(negative.any()):
        raise ValueError(
            f"base_nll must be >= 0 on active tokens (it is a surprisal); found "
            f"{int(negative.sum())} negative value(s), min {float(active_base.min()):.6g}"
        )
    if token_nll is not None:
        bad_tok = ~torch.isfinite(token_nll.detach()[mask])
        if bool(bad_tok.any()):
            raise ValueError(
                f"token_nll must be finite on active tokens; found {int(bad_tok.sum())} "
                "non-finite value(s)"
            )

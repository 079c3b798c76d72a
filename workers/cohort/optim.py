"""AdamW and gradient clipping over stacked parameters, independent per member.

Every tensor has a leading member axis K. The update of member k is exactly
``torch.optim.AdamW`` (non-foreach, non-amsgrad, decoupled weight decay) with member k's
own learning rate and weight decay, and clipping is ``clip_grad_norm_`` by member k's own
gradient norm. ``used[k]`` says whether member k's loss reached a parameter at this step:
a lone trial's AdamW skips a parameter whose ``.grad`` is None (no step count, no weight
decay), so a member skips it too.
"""

from __future__ import annotations

import torch

from workers.adamw import Tensors


def _per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[K]`` -> broadcastable against ``like [K, ...]``, in like's dtype."""
    return values.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


def clip_per_member(grads: Tensors, max_norm: torch.Tensor) -> None:
    """``clip_grad_norm_`` per member, in place; ``max_norm [K]`` (inf = no clipping)."""
    if not grads:
        return
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in grads.values()], dim=1)
    total = torch.linalg.vector_norm(norms, 2, dim=1)
    coefficient = (max_norm.to(total.dtype) / (total + 1e-6)).clamp(max=1.0)
    for grad in grads.values():
        grad.mul_(_per_member(coefficient, grad))


class StackedAdamW:
    """AdamW state for stacked parameters; ``lr`` and ``weight_decay`` are ``[K]`` float64 tensors."""

    def __init__(self, params: Tensors, lr: torch.Tensor, weight_decay: torch.Tensor,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = params
        self.lr, self.weight_decay = lr, weight_decay
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.state: dict[str, Tensors] = {}

    def state_of(self, name: str, param: torch.Tensor) -> Tensors:
        """Parameter ``name``'s AdamW state (every member's row), made at zero on first use."""
        if name not in self.state:
            self.state[name] = {
                "step": torch.zeros(param.shape[0], dtype=torch.float64, device=param.device),
                "exp_avg": torch.zeros_like(param), "exp_avg_sq": torch.zeros_like(param),
            }
        return self.state[name]

    @torch.no_grad()
    def step(self, grads: Tensors, used: Tensors) -> None:
        """One update; ``grads[name]`` as the params, ``used[name]`` a ``[K]`` bool tensor."""
        for name, grad in grads.items():
            param = self.params[name]
            state = self.state_of(name, param)
            mask = used[name]
            # Eager on the CPU only: no device sync there, and under torch.compile a branch on a
            # tensor's value would be a guard that recompiles the update whenever it flips.
            if mask.device.type == "cpu" and not torch.compiler.is_compiling() and bool(mask.all()):
                self._step_all(param, grad, state)
                continue
            keep = _per_member(mask, param).bool()
            state["step"] += mask.to(torch.float64)
            decay = torch.where(mask, 1 - self.lr * self.weight_decay, 1.0)
            param.mul_(_per_member(decay, param))
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.copy_(torch.where(keep, exp_avg.lerp(grad, 1 - self.beta1), exp_avg))
            moved = exp_avg_sq.mul(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            exp_avg_sq.copy_(torch.where(keep, moved, exp_avg_sq))
            step = state["step"].clamp_min(1.0)
            step_size = self.lr / (1 - self.beta1 ** step)
            correction2_sqrt = (1 - self.beta2 ** step) ** 0.5
            denom = (exp_avg_sq.sqrt() / _per_member(correction2_sqrt, param)).add_(self.eps)
            updated = param + _per_member(-step_size, param) * exp_avg / denom
            param.copy_(torch.where(keep, updated, param))

    def _step_all(self, param: torch.Tensor, grad: torch.Tensor, state: Tensors) -> None:
        """:meth:`step` of one parameter that every member's loss reached, in place: the same
        arithmetic in the same order (so the same values), without the selections and the
        copies they need, which made a step about three times a lone AdamW's on the CPU."""
        state["step"] += 1.0
        param.mul_(_per_member(1 - self.lr * self.weight_decay, param))
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - self.beta1)
        exp_avg_sq.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        step = state["step"]
        step_size = self.lr / (1 - self.beta1 ** step)
        correction2_sqrt = (1 - self.beta2 ** step) ** 0.5
        denom = exp_avg_sq.sqrt().div_(_per_member(correction2_sqrt, param)).add_(self.eps)
        param.add_((_per_member(-step_size, param) * exp_avg).div_(denom))

    def select(self, index: torch.Tensor) -> None:
        """Keep only the members at ``index`` (the cohort shrank); params are re-selected by the caller."""
        self.lr, self.weight_decay = self.lr[index], self.weight_decay[index]
        self.state = {name: {key: value[index] for key, value in state.items()}
                      for name, state in self.state.items()}

    def member_state(self, name: str, member: int) -> Tensors | None:
        """Member's ``torch.optim.AdamW`` state of one parameter (None: never stepped)."""
        state = self.state.get(name)
        if state is None or float(state["step"][member]) == 0:
            return None
        return {"step": state["step"][member].to(torch.get_default_dtype()).clone(),
                "exp_avg": state["exp_avg"][member].clone(),
                "exp_avg_sq": state["exp_avg_sq"][member].clone()}

    def reset_member(self, name: str, member: int) -> None:
        """Clear member's state of one parameter, as a lone AdamW drops a parameter's state."""
        state = self.state.get(name)
        if state is not None:
            for value in state.values():
                value[member] = 0

    def load_member_state(self, name: str, member: int, state: Tensors) -> None:
        """Set member's state of one parameter from a ``torch.optim.AdamW`` state entry."""
        own = self.state_of(name, self.params[name])
        own["step"][member] = float(state["step"])
        own["exp_avg"][member] = state["exp_avg"]
        own["exp_avg_sq"][member] = state["exp_avg_sq"]

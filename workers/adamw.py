"""AdamW for one model, without ``torch.optim``.

Every method of a ``torch.optim`` optimizer imports ``torch._dynamo`` on its first call (the
methods are wrapped in ``torch._disable_dynamo``), and that import costs each trial worker more
than a second of CPU; nothing a trial trains with compiles through ``torch.optim``, so trials
use this class instead. The update is ``torch.optim.AdamW``'s single-tensor path
(``foreach=False``, no amsgrad, decoupled weight decay) op for op, so its values are bitwise
that optimizer's; :meth:`state_dict` is that optimizer's format, so a checkpoint written by
either one loads into the other (``tests/workers/test_adamw.py`` holds both to it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]

# torch.optim.AdamW(foreach=False)'s group flags: what this class implements (foreach and fused
# only choose kernels, so a state written with either loads).
_TORCH_GROUP_FLAGS = {"amsgrad": False, "maximize": False, "foreach": False, "capturable": False,
                      "differentiable": False, "fused": None, "decoupled_weight_decay": True}


def _step_dtype() -> torch.dtype:
    # torch.optim keeps a CPU step counter in float64 only when that is the default dtype.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class AdamW:
    """``torch.optim.AdamW(params, lr, weight_decay=weight_decay, foreach=False)``, one group.

    ``state`` maps each parameter that has been stepped to its ``step`` (a CPU scalar tensor),
    ``exp_avg`` and ``exp_avg_sq``, as ``torch.optim`` keeps them. A parameter whose ``.grad``
    is None at a step is skipped: no step count, no weight decay.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = list(params)
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.state: dict[torch.Tensor, Tensors] = {}

    def zero_grad(self) -> None:
        """Drop every gradient (``set_to_none=True``, ``torch.optim``'s default)."""
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        beta1, beta2 = self.betas
        for param in self.params:
            grad = param.grad
            if grad is None:
                continue
            state = self.state.get(param)
            if not state:
                state = self.state[param] = {
                    "step": torch.tensor(0.0, dtype=_step_dtype()),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            state["step"] += 1
            if self.weight_decay != 0:
                param.mul_(1 - self.lr * self.weight_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = state["step"].item()  # a CPU tensor: no device sync
            step_size = self.lr / (1 - beta1**step)
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim.AdamW.state_dict()``'s format: states by parameter index, one group."""
        group = {"lr": self.lr, "betas": self.betas, "eps": self.eps,
                 "weight_decay": self.weight_decay, **_TORCH_GROUP_FLAGS,
                 "params": list(range(len(self.params)))}
        states = {index: dict(self.state[param]) for index, param in enumerate(self.params)
                  if self.state.get(param)}
        return {"state": states, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` or from ``torch.optim.AdamW.state_dict()``.

        Raises:
            ValueError: If it holds another number of groups or parameters, another parameter's
                shape, or flags this class does not implement (amsgrad, maximize...); nothing
                is changed then.
        """
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            counts = [len(group["params"]) for group in groups]
            raise ValueError(f"the optimizer state holds parameter groups of sizes {counts}; this "
                             f"model has one group of {len(self.params)}: it is from another model")
        group = groups[0]
        unsupported = {key: group[key] for key, value in _TORCH_GROUP_FLAGS.items()
                       if key in group and group[key] != value and key not in ("foreach", "fused")}
        if unsupported:
            raise ValueError(f"the optimizer state was written with {unsupported}, which this "
                             f"AdamW does not implement; it implements {_TORCH_GROUP_FLAGS}")
        by_index = dict(zip(group["params"], self.params, strict=True))
        state: dict[torch.Tensor, Tensors] = {}
        for index, entry in state_dict["state"].items():
            param = by_index[index]
            if entry["exp_avg"].shape != param.shape:
                raise ValueError(f"the optimizer state of parameter {index} has shape "
                                 f"{tuple(entry['exp_avg'].shape)}; the model's is "
                                 f"{tuple(param.shape)}: it is from another model")
            state[param] = {
                "step": entry["step"].detach().clone().cpu(),
                "exp_avg": entry["exp_avg"].to(device=param.device, dtype=param.dtype, copy=True),
                "exp_avg_sq": entry["exp_avg_sq"].to(device=param.device, dtype=param.dtype, copy=True),
            }
        self.lr, self.weight_decay = group["lr"], group["weight_decay"]
        self.betas, self.eps = (group["betas"][0], group["betas"][1]), group["eps"]
        self.state = state

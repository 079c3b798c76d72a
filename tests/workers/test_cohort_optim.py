"""The cohort's stacked AdamW against one ``torch.optim.AdamW`` per member, step by step."""

import torch

from workers.cohort.optim import StackedAdamW

K, STEPS = 3, 5


def _lone_and_stacked(used_by_step):
    """Run the stacked optimizer and K lone AdamWs (a lone trial's: non-foreach) on the same
    float64 gradients; a member whose ``used`` is False at a step has no ``.grad`` there."""
    generator = torch.Generator().manual_seed(0)
    shapes = {"w": (K, 4, 3), "b": (K, 4)}
    start = {n: torch.randn(s, generator=generator, dtype=torch.float64) for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=generator, dtype=torch.float64) for n, s in shapes.items()}
             for _ in range(STEPS)]
    lr = torch.tensor([1e-2, 3e-3, 5e-2], dtype=torch.float64)
    decay = torch.tensor([0.0, 0.01, 0.1], dtype=torch.float64)
    stacked = StackedAdamW({n: v.clone() for n, v in start.items()}, lr, decay)
    lone = [{n: torch.nn.Parameter(v[k].clone()) for n, v in start.items()} for k in range(K)]
    optimizers = [torch.optim.AdamW(list(p.values()), lr=float(lr[k]), weight_decay=float(decay[k]),
                                    foreach=False) for k, p in enumerate(lone)]
    for step in range(STEPS):
        used = used_by_step(step)
        stacked.step({n: g.clone() for n, g in grads[step].items()},
                     {n: torch.tensor(used) for n in shapes})
        for k, (params, optimizer) in enumerate(zip(lone, optimizers, strict=True)):
            for name, param in params.items():
                param.grad = grads[step][name][k].clone() if used[k] else None
            optimizer.step()
    return stacked, lone


def test_every_member_stepping_is_each_members_lone_adamw():
    """The in-place path (every member's loss reached every parameter) is a lone AdamW each."""
    stacked, lone = _lone_and_stacked(lambda step: [True] * K)
    for k in range(K):
        for name, param in lone[k].items():
            torch.testing.assert_close(stacked.params[name][k], param.detach(), rtol=0, atol=1e-12)
    assert stacked.state["w"]["step"].tolist() == [STEPS] * K


def test_a_member_that_skips_steps_is_its_lone_adamw_too():
    """Member 1 has no gradient at steps 1 and 3 (the selecting path), the others always (the
    in-place path at steps 0, 2, 4): each still equals its lone AdamW, member 1 at 3 steps."""
    stacked, lone = _lone_and_stacked(lambda step: [True, step % 2 == 0, True])
    for k in range(K):
        for name, param in lone[k].items():
            torch.testing.assert_close(stacked.params[name][k], param.detach(), rtol=0, atol=1e-12)
    assert stacked.state["b"]["step"].tolist() == [STEPS, 3, STEPS]

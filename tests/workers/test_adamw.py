"""The trials' AdamW (workers/adamw.py) against torch.optim.AdamW(foreach=False), the
independent implementation: bitwise equal values on adversarial gradients, and checkpoints
that load in either direction."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workers.adamw import AdamW

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(), (7,), (3, 5), (2, 3, 4)]


def _params(dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, dtype=dtype, generator=generator).requires_grad_() for shape in SHAPES]


def _gradient(step: int, index: int, like: torch.Tensor) -> torch.Tensor | None:
    """A schedule of hard gradients: missing, zero, huge, tiny, mixed signs, ordinary."""
    generator = torch.Generator().manual_seed(1000 * step + index)
    kind = (step + index) % 6
    if kind == 0 and step % 4 == 1:
        return None  # this parameter got no gradient at this step: no step count, no decay
    noise = torch.randn(like.shape, dtype=like.dtype, generator=generator)
    scale = {0: 0.0, 1: 1e30, 2: 1e-30, 3: 1.0, 4: 1e3, 5: 1e-8}[kind]
    return noise * scale


def _run(optimizer, params: list[torch.Tensor], steps: range) -> None:
    for step in steps:
        optimizer.zero_grad()
        for index, param in enumerate(params):
            param.grad = _gradient(step, index, param)
        optimizer.step()


def _assert_same(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_the_update_is_bitwise_torch_optim_adamw(dtype, weight_decay):
    ours, theirs = _params(dtype), _params(dtype)
    mine = AdamW(ours, lr=3e-3, weight_decay=weight_decay)
    reference = torch.optim.AdamW(theirs, lr=3e-3, weight_decay=weight_decay, foreach=False)
    _run(mine, ours, range(60))
    _run(reference, theirs, range(60))
    _assert_same(ours, theirs)
    for param, twin in zip(ours, theirs, strict=True):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(mine.state[param][key], reference.state[twin][key],
                                       rtol=0, atol=0, equal_nan=True)


def test_a_parameter_never_given_a_gradient_has_no_state_and_does_not_decay():
    params = _params(torch.float64)
    before = params[1].detach().clone()
    optimizer = AdamW(params, lr=0.1, weight_decay=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        params[0].grad = torch.ones_like(params[0])
        optimizer.step()
    assert set(optimizer.state) == {params[0]}
    assert float(optimizer.state[params[0]]["step"]) == 3.0
    assert torch.equal(params[1].detach(), before)
    assert optimizer.state_dict()["state"].keys() == {0}


@pytest.mark.parametrize("writer", ["ours", "torch"])
def test_a_checkpoint_from_either_optimizer_resumes_in_the_other_bitwise(writer):
    """Checkpoints written before trials stopped using torch.optim still resume, and the
    other way round; the run after the resume equals an uninterrupted torch.optim run."""
    straight = _params(torch.float32)
    uninterrupted = torch.optim.AdamW(straight, lr=1e-2, weight_decay=0.05, foreach=False)
    _run(uninterrupted, straight, range(40))

    first, second = _params(torch.float32), _params(torch.float32)
    if writer == "ours":
        before, after = AdamW(first, lr=1e-2, weight_decay=0.05), torch.optim.AdamW(
            second, lr=1.0, weight_decay=0.0, foreach=False)
    else:  # as the trainers built it before: foreach left to torch (on CPU, the single-tensor path)
        before, after = torch.optim.AdamW(first, lr=1e-2, weight_decay=0.05), AdamW(
            second, lr=1.0, weight_decay=0.0)
    _run(before, first, range(20))
    saved = before.state_dict()
    with torch.no_grad():
        for param, source in zip(second, first, strict=True):
            param.copy_(source)
    after.load_state_dict(saved)  # its hyperparameters come from the checkpoint, as torch's do
    _run(after, second, range(20, 40))
    _assert_same(second, straight)


def test_the_state_dict_is_torch_optims_format():
    ours, theirs = _params(torch.float32), _params(torch.float32)
    mine = AdamW(ours, lr=2e-3, weight_decay=0.01)
    reference = torch.optim.AdamW(theirs, lr=2e-3, weight_decay=0.01, foreach=False)
    _run(mine, ours, range(5))
    _run(reference, theirs, range(5))
    written, expected = mine.state_dict(), reference.state_dict()
    assert written["param_groups"] == expected["param_groups"]
    assert written["state"].keys() == expected["state"].keys()
    for index, entry in expected["state"].items():
        assert written["state"][index].keys() == entry.keys()
        for key, value in entry.items():
            assert written["state"][index][key].dtype == value.dtype, key
            assert written["state"][index][key].device == value.device, key
            assert torch.equal(written["state"][index][key], value), (index, key)


def test_a_state_from_another_model_or_with_amsgrad_is_refused_and_nothing_changes():
    params = _params(torch.float32)
    optimizer = AdamW(params, lr=1e-3)
    _run(optimizer, params, range(3))
    kept = {param: {key: value.clone() for key, value in state.items()}
            for param, state in optimizer.state.items()}
    fewer = torch.optim.AdamW(_params(torch.float32)[:2], lr=1e-3, foreach=False)
    with pytest.raises(ValueError, match=r"groups of sizes \[2\]; this model has one group of 4"):
        optimizer.load_state_dict(fewer.state_dict())
    other = [torch.zeros(shape[::-1] + (2,)).requires_grad_() for shape in SHAPES]
    reshaped = torch.optim.AdamW(other, lr=1e-3, foreach=False)
    _run(reshaped, other, range(2))
    with pytest.raises(ValueError, match="parameter 0 has shape"):
        optimizer.load_state_dict(reshaped.state_dict())
    amsgrad = torch.optim.AdamW(_params(torch.float32), lr=1e-3, amsgrad=True, foreach=False)
    with pytest.raises(ValueError, match="'amsgrad': True"):
        optimizer.load_state_dict(amsgrad.state_dict())
    assert optimizer.lr == 1e-3
    for param, state in kept.items():
        for key, value in state.items():
            assert torch.equal(optimizer.state[param][key], value)


def test_a_lone_trial_trains_and_checkpoints_without_importing_torch_dynamo(tmp_path):
    """What the class is for: a trial worker that never compiles never pays for torch._dynamo."""
    probe = (
        "import sys\n"
        "from sweeps.spec import load_sweep_spec\n"
        "from workers.train import Trainer\n"
        "spec = load_sweep_spec('sweeps/examples/quickstart.yaml')\n"
        f"trainer = Trainer.create(spec.trial_config(1.0, 'uniform', 'discrete', 0), {str(tmp_path)!r})\n"
        "trainer.run_epoch()\n"
        f"trainer.save_checkpoint({str(tmp_path / 'state.pt')!r})\n"
        f"trainer.load_checkpoint({str(tmp_path / 'state.pt')!r})\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout + done.stderr[-2000:]

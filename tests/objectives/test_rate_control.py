"""The target-rate control (objectives/rate_control.py): its update, its weight in the stack,
and the option combinations it refuses."""

import math

import pytest
import torch
from pydantic import ValidationError

from objectives import LossInputs, LossStackSpec
from objectives.options import KLOptions
from objectives.rate_control import RateControl, batch_rate


def _control(target: float = 0.5, beta: float = 1.0, **options) -> RateControl:
    control = RateControl.create(KLOptions(target_rate=target, **options), beta)
    assert control is not None
    return control


def test_a_rate_above_the_target_raises_the_price_and_one_below_lowers_it():
    control = _control(0.5, beta=2.0, rate_control_lr=0.1)
    assert float(control.beta) == pytest.approx(2.0, rel=1e-12)
    control.update(torch.tensor(1.0))  # twice the target: log beta += 0.1 x 1
    assert float(control.log_beta) == pytest.approx(math.log(2.0) + 0.1, rel=1e-12)
    control.update(torch.tensor(0.0))  # no information at all: log beta -= 0.1, beta stays > 0
    assert float(control.beta) == pytest.approx(2.0, rel=1e-12)
    control.update(torch.tensor(0.5))  # on target: unchanged
    assert float(control.beta) == pytest.approx(2.0, rel=1e-12)


def test_beta_stays_within_its_bounds_and_positive():
    control = _control(0.5, beta=1.0, rate_control_lr=1.0, rate_control_min_beta=1e-3,
                       rate_control_max_beta=10.0)
    for _ in range(50):
        control.update(torch.tensor(0.0))
    assert float(control.beta) == pytest.approx(1e-3, rel=1e-9)
    for _ in range(50):
        control.update(torch.tensor(100.0))
    assert float(control.beta) == pytest.approx(10.0, rel=1e-9)


def test_stacked_members_update_each_on_its_own_rate():
    members = [_control(0.5, beta=b, rate_control_lr=0.2) for b in (1.0, 0.1)]
    stacked = RateControl.stack(members)
    stacked.update(torch.tensor([1.0, 0.25], dtype=torch.float64))
    alone = [_control(0.5, beta=b, rate_control_lr=0.2) for b in (1.0, 0.1)]
    alone[0].update(torch.tensor(1.0))
    alone[1].update(torch.tensor(0.25))
    for j, control in enumerate(alone):
        assert torch.equal(stacked.member(j).log_beta, control.log_beta)
    with pytest.raises(ValueError, match="share their settings"):
        RateControl.stack([_control(0.5), _control(0.7)])


def test_the_held_out_gap_moves_the_train_target_halfway_and_within_bounds():
    control = _control(0.3, rate_control_lr=0.1)
    assert float(control.train_target) == 0.3  # R* at the start
    control.correct(held_out_rate=0.5, train_rate=0.3)  # val spends 5/3 of train's nats
    assert float(control.train_target) == pytest.approx(0.5 * 0.3 + 0.5 * 0.3 * 0.3 / 0.5, rel=1e-12)
    before = float(control.log_beta)
    control.update(torch.tensor(0.24, dtype=torch.float64))  # the steps steer to 0.24: on it, beta holds
    assert float(control.log_beta) == pytest.approx(before, abs=1e-12)
    control.correct(held_out_rate=0.01, train_rate=0.02)  # train below R*/10: no gap to read
    assert float(control.train_target) == pytest.approx(0.24, rel=1e-12)
    for _ in range(20):
        control.correct(held_out_rate=10.0, train_rate=0.3)
    assert float(control.train_target) == pytest.approx(0.3 / 4, rel=1e-9)  # the lower bound
    for _ in range(20):
        control.correct(held_out_rate=0.05, train_rate=3.0)
    assert float(control.train_target) == pytest.approx(0.3 * 4, rel=1e-9)  # the upper bound


def test_without_held_out_correction_the_train_target_stays_the_declared_rate():
    control = _control(0.3, rate_control_held_out=False)
    control.correct(held_out_rate=0.5, train_rate=0.3)
    assert float(control.train_target) == 0.3
    control = _control(0.3)
    control.correct(held_out_rate=float("nan"), train_rate=0.3)
    assert float(control.train_target) == 0.3


def test_the_train_target_is_stacked_sliced_and_checkpointed():
    controls = [_control(0.3), _control(0.3)]
    controls[1].correct(held_out_rate=0.6, train_rate=0.3)
    stacked = RateControl.stack(controls)
    assert stacked.train_target.tolist() == pytest.approx([0.3, 0.225], rel=1e-12)
    assert float(stacked.member(1).train_target) == pytest.approx(0.225, rel=1e-12)
    restored = _control(0.3)
    restored.load_state_dict(controls[1].state_dict())
    assert float(restored.train_target) == pytest.approx(0.225, rel=1e-12)
    restored.load_state_dict({"log_beta": torch.tensor(0.0, dtype=torch.float64)})  # an older checkpoint
    assert float(restored.train_target) == 0.3


def test_the_rate_is_the_mean_kl_over_examples_with_an_active_token():
    kl = torch.tensor([[0.2, 0.3], [5.0, 5.0], [1.0, 0.0]])  # [B, D]: the per-example sum
    mask = torch.tensor([[True, False], [False, False], [True, True]])
    assert float(batch_rate(kl, mask)) == pytest.approx((0.5 + 1.0) / 2)


def test_the_multiplier_replaces_the_kl_weight_in_the_total():
    spec = LossStackSpec(terms={"uniform": 1.0, "kl": {"weight": 0.7, "options": {"target_rate": 0.4}}})
    stack = spec.build()
    control = stack.rate_control()
    assert control is not None and float(control.beta) == pytest.approx(0.7)
    token = torch.full((3, 4), 2.0, dtype=torch.float64)
    mask = torch.ones(3, 4, dtype=torch.bool)
    kl = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    inputs = LossInputs(token_nll=token, base_nll=token.clone(), mask=mask, kl=kl)
    assert float(stack(inputs).total) == pytest.approx(2.0 + 0.7 * 0.2)
    inputs.kl_weight = torch.tensor(0.05, dtype=torch.float64)
    assert float(stack(inputs).total) == pytest.approx(2.0 + 0.05 * 0.2)
    assert LossStackSpec(terms={"uniform": 1.0, "kl": 0.7}).build().rate_control() is None


@pytest.mark.parametrize("options,field", [
    ({"mutual_info_credit": 1.0}, "mutual_info_credit"),
    ({"anneal": "linear"}, "anneal"),
    ({"free_bits": 0.5}, "free_bits"),
    ({"rate_control_min_beta": 1.0, "rate_control_max_beta": 0.5}, "rate_control_min_beta"),
])
def test_options_that_contradict_a_target_rate_are_refused_naming_the_fix(options, field):
    with pytest.raises(ValidationError, match=field):
        LossStackSpec(terms={"uniform": 1.0, "kl": {"weight": 1.0, "options": {"target_rate": 0.5, **options}}})


def test_a_target_rate_needs_a_positive_starting_weight():
    with pytest.raises(ValidationError, match="starting beta"):
        LossStackSpec(terms={"uniform": 1.0, "kl": {"weight": 0.0, "options": {"target_rate": 0.5}}})
    with pytest.raises(ValidationError, match="target_rate"):
        KLOptions(target_rate=0.0)

"""A trial's run in optimizer steps and its units: how the lone trainer and a cohort count
steps, schedules resolved against them, and the constants a trial logs (c_base, the mean
target length, its steps, beta in ELBO units)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from objectives import LossStackSpec
from workers.cohort.trainer import Cohort
from workers.contract import (
    C_BASE_PARAM,
    ELBO_BETA_PARAM,
    RUN_CONSTANT_PARAMS,
    TOTAL_STEPS_PARAM,
    TRAIN_TARGET_LENGTH_PARAM,
)
from workers.train import Trainer, TrialConfig, load_trial_config
from workers.trial import run_constants

EXAMPLES = Path(__file__).resolve().parents[2] / "workers" / "examples"


def short_run(stack: dict, train_size: int = 577, **model) -> TrialConfig:
    """3 epochs of 577 rows at batch 32: 57 optimizer steps (the first real-text study's budget)."""
    config = load_trial_config(EXAMPLES / "discrete.yaml")
    return config.model_copy(update={
        "data": config.data.model_copy(update={"train_size": train_size, "val_size": 32,
                                               "test_size": 32}),
        "model": config.model.model_copy(update={"embedding_dim": 8, "hidden_dim": 8, **model}),
        "loss_stack": LossStackSpec.model_validate(stack),
        "training": config.training.model_copy(update={"epochs": 3, "batch_size": 32, "device": "cpu"}),
    })


def test_the_lone_trainer_takes_the_steps_it_plans_and_resolves_fractions(tmp_path):
    stack = {"preset": "uniform", "alpha": 0.0, "terms": {"kl": {"weight": 2.0, "options": {
        "anneal": "linear", "warmup_fraction": 0.5}}}}
    config = short_run(stack, discrete_estimator="gumbel", gumbel_anneal_fraction=0.25)
    trainer = Trainer.create(config, tmp_path)
    assert trainer.total_steps == config.total_steps(577) == 57
    assert trainer.model.gumbel_decay_steps == 14  # 0.25 x 57 = 14.25
    stack_now, _ = trainer.loss_stacks()
    assert stack_now.weights_at(0)["kl"] == 0.0
    assert stack_now.weights_at(14)["kl"] == pytest.approx(2.0 * 14 / 29)  # 0.5 x 57 -> 29
    assert stack_now.weights_at(29)["kl"] == 2.0
    seen = []
    trainer.run(on_epoch=lambda t, epoch, metrics: seen.append(t.step))
    assert seen == [19, 38, 57] and trainer.step == trainer.total_steps  # 19 batches, the last of 1
    assert trainer.model.gumbel_temperature() == pytest.approx(config.model.gumbel_temperature_end)
    assert config.schedule_overruns(57) == []


def test_a_cohort_counts_steps_as_its_members_alone(tmp_path):
    stack = {"preset": "uniform", "alpha": 0.0, "terms": {"kl": {"options": {
        "anneal": "cyclical", "cycles": 2, "scale": "token"}}}}
    configs = [short_run(stack, train_size=100).model_copy(update={"seed": seed}) for seed in (0, 1)]
    cohort = Cohort.create(configs, tmp_path)
    cohort.run()
    expected = 3 * math.ceil(100 / 32)
    assert cohort.step == expected
    assert [m.trainer.total_steps for m in cohort.members] == [expected, expected]
    assert [m.trainer.step for m in cohort.members] == [expected, expected]


def test_schedule_overruns_name_the_default_warmup_and_gumbel_decay_of_a_57_step_trial():
    config = short_run({"preset": "uniform", "alpha": 0.0, "terms": {"kl": {"options": {
        "anneal": "linear"}}}}, discrete_estimator="gumbel")
    assert config.schedule_overruns(57) == ["KL warm-up of 1000 steps",
                                            "Gumbel temperature decay of 2000 steps"]
    assert config.schedule_overruns(2001) == []
    enumerate_ = config.model_copy(update={"model": config.model.model_copy(
        update={"discrete_estimator": "enumerate"})})
    assert enumerate_.schedule_overruns(57) == ["KL warm-up of 1000 steps"]  # no Gumbel there


@pytest.mark.parametrize(("preset", "scale", "per_length"), [
    ("uniform", "example", True), ("ncc", "example", True), ("uniform", "token", False),
])
def test_run_constants_measure_the_train_split(preset, scale, per_length, tmp_path):
    config = short_run({"preset": preset, "alpha": 1.0, "terms": {"kl": {"weight": 0.5, "options": {
        "scale": scale}}}}, train_size=64)
    trainer = Trainer.create(config, tmp_path)
    constants = run_constants(trainer)
    assert set(constants) == set(RUN_CONSTANT_PARAMS)
    mask = trainer.train_data.split.mask
    length = mask.sum().item() / mask.shape[0]
    assert constants[TRAIN_TARGET_LENGTH_PARAM] == pytest.approx(length, rel=1e-12)
    assert 6 <= length <= 8  # prefix 2 + a body of 4-6 tokens
    assert constants[TOTAL_STEPS_PARAM] == 3 * 2 and isinstance(constants[TOTAL_STEPS_PARAM], int)
    c_base = constants[C_BASE_PARAM]
    expected = 0.5 * (length if per_length else 1.0) * (c_base if preset == "ncc" else 1.0)
    assert constants[ELBO_BETA_PARAM] == pytest.approx(expected, rel=1e-12)


def test_gumbel_steps_and_fraction_together_are_refused_naming_both():
    from pydantic import ValidationError

    from workers.models.config import ModelConfig

    with pytest.raises(ValidationError, match="gumbel_anneal_steps .* or gumbel_anneal_fraction .* not both"):
        ModelConfig(gumbel_anneal_steps=100, gumbel_anneal_fraction=0.5)
    assert ModelConfig(gumbel_anneal_fraction=0.5).gumbel_decay_steps(57) == 29
    assert ModelConfig().gumbel_decay_steps() == 2000
    with pytest.raises(ValueError, match="gumbel_anneal_fraction is relative to the trial's run"):
        ModelConfig(gumbel_anneal_fraction=0.5).gumbel_decay_steps()

"""Objective equivalence (dedup), effective beta, and the beta / free-bits axes."""

from typing import Any

import pytest
from pydantic import ValidationError

from objectives import LossStackSpec
from objectives.units import effective_beta, reconstruction_scale
from sweeps import SweepSpec, build_plan
from sweeps.plan.equivalence import objective_signature

CC = {"name": "concentration_corrected", "terms": {"concentration_corrected": 1.0}}


def sig(alpha: float, preset: str | None = None, **terms: Any) -> str:
    return objective_signature(LossStackSpec(preset=preset, alpha=alpha, terms=terms))


def spec(**fields: Any) -> SweepSpec:
    return SweepSpec.model_validate({"name": "t", **fields})


def test_identities_of_the_objective_library():
    uniform = sig(0, "uniform")
    assert sig(2.0, "uniform") == sig(0.5, "uniform") == uniform
    assert sig(0, "raw_token_weighted") == uniform
    assert sig(0, concentration_corrected=1.0) == uniform
    assert sig(0, "ncc") == sig(3.0, "normalized_uniform")
    assert sig(0, "raw_plus_ncc") == sig(1.0, uniform=1.0, normalized_uniform=1.0)
    assert sig(1, "raw_token_weighted") != uniform
    assert sig(1, concentration_corrected=1.0) != sig(1, "raw_token_weighted")
    assert sig(1, "raw_token_weighted") != sig(2, "raw_token_weighted")


def test_term_options_weights_and_merging():
    # A term's own alpha overrides the stack's: at 0 it is uniform whatever the stack's alpha.
    assert sig(2.0, token_weighted={"weight": 1.0, "options": {"alpha": 0.0}}) == sig(0, "uniform")
    assert sig(2.0, token_weighted={"options": {"alpha": 1.0}}) == sig(1.0, "raw_token_weighted")
    # Weight-0 terms do not train; coinciding terms add their weights.
    assert sig(1.0, uniform=1.0, bag_of_words=0.0) == sig(0, "uniform")
    assert sig(0, uniform=1.0, token_weighted=1.0) == sig(0, uniform=2.0)
    # Default options are resolved: no free bits is free_bits 0.
    assert sig(0, uniform=1.0, kl={"weight": 1.0}) == sig(
        0, uniform=1.0, kl={"weight": 1.0, "options": {"free_bits": 0.0}})
    assert sig(0, uniform=1.0, kl=1.0) != sig(0, uniform=1.0, kl=0.5)


def test_effective_beta_per_stack():
    def eff(beta: float, c_base: float, preset: str | None = None, **terms: Any) -> float:
        stack = LossStackSpec(preset=preset, alpha=1.0, terms={**terms, "kl": beta})
        return effective_beta(stack, c_base)

    assert eff(0.5, 2.5, "uniform") == pytest.approx(0.5)
    assert eff(0.5, 2.5, "raw_token_weighted") == pytest.approx(0.5)
    assert eff(0.5, 2.5, concentration_corrected=1.0) == pytest.approx(0.5)
    assert eff(0.5, 2.5, "ncc") == pytest.approx(1.25)  # beta * c_base
    assert eff(0.5, 2.5, "normalized_uniform") == pytest.approx(1.25)
    assert eff(1.0, 2.0, "raw_plus_ncc") == pytest.approx(1 / 1.5)  # beta / (1 + 1/c_base)
    assert reconstruction_scale(LossStackSpec(preset="raw_plus_ncc"), 4.0) == pytest.approx(1.25)
    assert effective_beta(LossStackSpec(preset="uniform"), 2.0) is None  # no kl term


def test_beta_and_free_bits_axes_reach_the_trial():
    sweep = spec(template={"data": {"num_strategies": 4}}, beta=[0.5, 2.0], free_bits=[0, 0.5],
                 loss_stacks=["uniform", "ncc"], alpha=[1.0], seeds=2)
    config = sweep.trial_config_for({"alpha": 1.0, "loss_stack": "ncc", "model": "discrete",
                                     "seed": 1, "beta": 2.0, "free_bits": 0.5})
    kl = config.loss_stack.resolved_terms()["kl"]
    assert kl.weight == 2.0 and kl.options["free_bits"] == 0.5
    assert config.name == "discrete-ncc-a1-b2-fb0.5-s1"
    plan = build_plan(sweep)
    assert plan.trials_requested == 2 * 2 * 2 * 2 and plan.trials_saved_by_dedup == 0
    assert {(r["beta"], r["free_bits"]) for r in plan.rows} == {
        (b, f) for b in (0.5, 2.0) for f in (0.0, 0.5)}


def test_uniform_is_one_trial_per_beta_not_across_betas():
    plan = build_plan(spec(beta=[0.5, 1.0], alpha=[0, 1, 2], loss_stacks=["uniform"], seeds=3))
    assert plan.trials_requested == 18 and plan.trial_count == 6
    assert {(t["beta"], t["seed"]) for t in plan.trials} == {
        (b, s) for b in (0.5, 1.0) for s in range(3)}


def test_caveat_stacks_dedup_at_alpha_zero():
    plan = build_plan(spec(alpha=[0, 1], loss_stacks=["uniform", "raw_token_weighted", CC], seeds=2))
    assert (plan.trials_requested, plan.trial_count, plan.trials_saved_by_dedup) == (12, 6, 6)


def _rejected(**fields: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        spec(**fields)
    return str(caught.value)


def test_free_bits_at_or_above_log_k_rejected():
    message = _rejected(template={"data": {"num_strategies": 2}},
                        common_terms={"kl": {"options": {"free_bits": 1.0}}})
    assert "common_terms.kl.options.free_bits" in message and "log K = 0.693" in message
    message = _rejected(template={"data": {"num_strategies": 2}}, free_bits=[0.0, 0.7])
    assert "free_bits: free bits 0.7 nats >= log K" in message
    assert spec(template={"data": {"num_strategies": 2}}, free_bits=[0.0, 0.6]).free_bits == [0, 0.6]


def test_beta_axis_needs_a_kl_term_and_the_right_search():
    assert "stack 'uniform' has no kl term" in _rejected(beta=[1.0], common_terms={})
    assert "beta: a list of values is a grid" in _rejected(
        beta=[1.0], alpha={"low": 0, "high": 1}, search={"kind": "random"})
    assert "beta: a range needs search.kind random or optuna" in _rejected(
        beta={"low": 0.1, "high": 1, "log": True})
    assert "beta.low must be > 0" in _rejected(
        beta={"low": 0, "high": 1, "log": True}, alpha={"low": 0, "high": 1},
        search={"kind": "random"})
    assert "beta: duplicate values 1" in _rejected(beta=[1, 1.0])


def test_analysis_names_swept_stacks():
    assert "analysis.contrasts[0].baseline" in _rejected(
        analysis={"contrasts": [{"stack": "raw_plus_ncc", "baseline": "ncc"}]})
    assert "analysis.caveat_treated" in _rejected(analysis={"primary": "caveat"})


@pytest.mark.parametrize("cohort_size", [1, "auto"])
def test_grid_param_space_runs_the_deduplicated_trials(cohort_size):
    from ray.tune.search.variant_generator import generate_variants

    from sweeps.tune.search_space import param_space

    sweep = spec(alpha=[0, 1, 2], beta=[0.5, 1.0], seeds=2, resources={"cohort_size": cohort_size})
    plan = build_plan(sweep)
    tune_trials = [config for _, config in generate_variants(param_space(sweep, plan))]
    assert len(tune_trials) == len(plan.cohorts) == (16 if cohort_size == 1 else 4)
    # Each Tune trial is a lone trial's params or a cohort's members: the plan's trials.
    variants = [m for t in tune_trials for m in (t.get("members") or [t])]
    assert len(variants) == plan.trial_count == 2 * 2 * (1 + 3)
    keys = ("alpha", "loss_stack", "model", "seed", "beta")
    assert [{k: v[k] for k in keys} for v in variants] == [
        {k: t[k] for k in keys} for t in plan.trials]
    shared = [v for v in variants if v["shared_by"]]
    assert len(shared) == 4 and shared[0]["shared_by"] == (
        "uniform@alpha=0,uniform@alpha=1,uniform@alpha=2")


def test_a_cohort_of_one_is_a_lone_tune_trial():
    from ray.tune.search.variant_generator import generate_variants

    from sweeps.tune.search_space import is_cohort, lone_params, param_space

    sweep = spec(alpha=[0, 1, 2], beta=[0.5, 1.0], seeds=2, resources={"cohort_size": 5})
    plan = build_plan(sweep)
    assert [len(c) for c in plan.cohorts] == [5, 5, 5, 1]
    tune_trials = [config for _, config in generate_variants(param_space(sweep, plan))]
    assert [is_cohort(t) for t in tune_trials] == [True, True, True, False]
    assert all(t["alpha"] is None and t["trial_index"] is None for t in tune_trials[:3])
    (index,) = plan.cohorts[3]
    lone = lone_params(tune_trials[3])
    trial = plan.trials[index]
    assert lone == {"trial_index": index, "shared_by": ",".join(trial["shared_by"]),
                    **{k: trial[k] for k in ("alpha", "loss_stack", "model", "seed", "beta")}}


def test_remedies_ride_the_template_and_change_neither_dedup_nor_cohorts():
    axes = {"alpha": [0, 1], "loss_stacks": ["uniform", "raw_token_weighted", CC], "seeds": 2,
            "resources": {"cohort_size": 4}}
    remedies = {"model": {"word_dropout": 0.25},
                "training": {"epochs": 3, "autoencoder_epochs": 1, "aggressive_epochs": 2,
                             "aggressive_encoder_steps": 3}}
    plain = build_plan(spec(template={"training": {"epochs": 3}}, **axes))
    remedied_spec = spec(template=remedies, **axes)
    remedied = build_plan(remedied_spec)
    # The remedies change how every trial trains, never which rows train one objective.
    assert [r["trial"] for r in remedied.rows] == [r["trial"] for r in plain.rows]
    assert (remedied.trial_count, remedied.cohorts) == (plain.trial_count, plain.cohorts)
    for trial in remedied.trials:
        config = remedied_spec.trial_config_for(trial)
        assert config.model.word_dropout == 0.25
        assert (config.training.autoencoder_epochs, config.training.aggressive_epochs,
                config.training.aggressive_encoder_steps) == (1, 2, 3)


def test_asha_never_judges_a_trial_on_its_pretraining_epochs():
    template = {"training": {"epochs": 4, "autoencoder_epochs": 2}}
    message = _rejected(template=template, scheduler={"kind": "asha", "grace_period": 2})
    assert "scheduler.grace_period (2) must be above template.training.autoencoder_epochs (2)" in message
    message = _rejected(template=template, scheduler={"kind": "asha", "grace_period": 1, "max_t": 2})
    assert "scheduler.max_t (2) must be above template.training.autoencoder_epochs (2)" in message
    assert build_plan(spec(template=template, scheduler={"kind": "asha", "grace_period": 3})).trial_count > 0

"""The report's units and budgets on trial results whose values are known by construction:
beta in ELBO units beside the raw beta, matching across KL scales, and the trials whose
schedule did not finish within their run."""

from __future__ import annotations

import math

import pytest

from objectives.units import elbo_beta
from sweeps import SweepSpec, build_plan
from sweeps.report.build import build_report, report_markdown
from sweeps.report.readout_table import TrialOutcome
from tests.sweeps.test_report import _find
from workers.contract import TOTAL_STEPS_PARAM, TRAIN_TARGET_LENGTH_PARAM

LENGTH, C_BASE = 10.0, 3.0
PER_TOKEN = {"name": "uniform_per_token", "preset": "uniform",
             "terms": {"kl": {"options": {"scale": "token"}}}}


def _outcomes(spec: SweepSpec, nmi, steps: int | None = 57, length: float | None = LENGTH):
    """NMI = nmi(trial's beta in ELBO units, seed); every trial logs c_base, its mean target
    length and its steps (None: not logged)."""
    outcomes = []
    for index, trial in enumerate(build_plan(spec).trials):
        stack = spec.stack_spec(trial["loss_stack"], trial["alpha"], trial.get("beta"))
        value = nmi(elbo_beta(stack, C_BASE, length or LENGTH), trial["seed"])
        final = {"c_base": C_BASE, "selected/epoch": 3, "selected/val/latent_nmi": value,
                 "selected/test/latent_nmi": value}
        if length is not None:
            final[TRAIN_TARGET_LENGTH_PARAM] = length
        if steps is not None:
            final[TOTAL_STEPS_PARAM] = float(steps)
        params = {k: trial[k] for k in ("alpha", "loss_stack", "model", "seed", "beta") if k in trial}
        outcomes.append(TrialOutcome(str(index), params, "done", final, {}))
    return outcomes


def test_cells_and_contrasts_carry_beta_in_elbo_units_and_the_markdown_shows_it():
    spec = SweepSpec.model_validate({"name": "u", "alpha": [1.0], "loss_stacks": ["uniform", "ncc"],
                                     "seeds": 3, "beta": [0.5, 2.0]})
    report = build_report(spec, "s", _outcomes(spec, lambda x, s: 0.1 * math.log2(x) + 0.01 * s + 0.5))
    uniform = _find(report["cells"], loss_stack="uniform", beta=0.5, split="test", kind="all",
                    metric="latent_nmi")
    ncc = _find(report["cells"], loss_stack="ncc", beta=0.5, split="test", kind="all", metric="latent_nmi")
    assert uniform["beta_elbo"] == pytest.approx(0.5 * LENGTH)
    assert ncc["beta_elbo"] == pytest.approx(0.5 * LENGTH * C_BASE) and ncc["beta_effective"] == 1.5
    contrast = _find(report["contrasts"], contrast="stack", beta=2.0, kind="all", metric="latent_nmi")
    assert contrast["beta_elbo"] == pytest.approx(20.0) and contrast["beta_matching"].startswith("interp")
    text = report_markdown(report)
    assert "| 0.5 (eff 0.5, ELBO units 5) | uniform |" in text
    assert "| 0.5 (eff 1.5, ELBO units 15) | ncc |" in text


def test_stacks_of_different_kl_scales_are_matched_in_elbo_units():
    """Per token, beta 1 is per example's beta 1 / 10 on 10-token targets: matched exactly."""
    spec = SweepSpec.model_validate({"name": "k", "alpha": [1.0], "loss_stacks": ["uniform", PER_TOKEN],
                                     "seeds": 3, "beta": [0.1, 1.0, 10.0]})
    report = build_report(spec, "s", _outcomes(spec, lambda x, s: 0.1 * math.log10(x) + 0.01 * s + 0.5))
    for beta, treated_elbo in ((0.1, 1.0), (1.0, 10.0)):
        entry = _find(report["contrasts"], contrast="stack", beta=beta, kind="all", metric="latent_nmi")
        assert entry["beta_matching"] == "exact" and entry["beta_elbo"] == pytest.approx(treated_elbo)
        assert entry["mean_diff"] == pytest.approx(0.0, abs=1e-12) and entry["n_pairs"] == 3
    # uniform at beta 10 is 100 in ELBO units: beyond the per-token stack's 0.1-10, not matched.
    beyond = _find(report["contrasts"], contrast="stack", beta=10.0, kind="all", metric="latent_nmi")
    assert beyond["beta_matching"] == "unmatched" and beyond["matched_on"] == "beta in ELBO units"
    assert beyond["claim"] == "no claim: no matched beta in ELBO units"


def test_without_a_logged_mean_length_contrasts_match_at_effective_beta_as_before():
    spec = SweepSpec.model_validate({"name": "o", "alpha": [1.0], "loss_stacks": ["uniform", "ncc"],
                                     "seeds": 3, "beta": [0.5, 1.0, 2.0, 4.0]})
    report = build_report(spec, "s", _outcomes(spec, lambda x, s: 0.5 + 0.01 * s, length=None))
    assert all(c["beta_elbo"] is None for c in report["cells"])
    entry = _find(report["contrasts"], contrast="stack", beta=2.0, kind="all", metric="latent_nmi")
    assert entry["beta_matching"] == "interpolated (log beta)" and entry["matched_on"] == "effective beta"


def test_trials_whose_schedule_did_not_finish_are_listed_under_what_it_cannot_claim():
    spec = SweepSpec.model_validate({
        "name": "s", "alpha": [0.0], "loss_stacks": ["uniform"], "seeds": 3,
        "common_terms": {"kl": {"options": {"anneal": "linear"}}},
        "template": {"model": {"discrete_estimator": "gumbel", "gumbel_anneal_fraction": 0.5}}})
    report = build_report(spec, "s", _outcomes(spec, lambda x, s: 0.5, steps=57))
    overrun = [line for line in report["limitations"] if "did not finish" in line]
    assert overrun == ["3 trial(s) (0, 1, 2) ran 57 optimizer steps, within which a schedule did "
                       "not finish: KL warm-up of 1000 steps; their last steps did not train at "
                       "the schedule's end value (give schedules relative to the run: "
                       "warmup_fraction, cycles, gumbel_anneal_fraction)"]
    assert overrun[0] in report_markdown(report).split("## What this report cannot claim")[1]
    # A trial that logged no steps is read from the plan: 10 epochs of 2048 rows at batch 64.
    planned = build_report(spec, "s", _outcomes(spec, lambda x, s: 0.5, steps=None))
    assert [line for line in planned["limitations"] if "did not finish" in line][0].startswith(
        "3 trial(s) (0, 1, 2) ran 320 optimizer steps")
    fits = build_report(spec.model_copy(update={"common_terms": {}}), "s",
                        _outcomes(spec, lambda x, s: 0.5, steps=57))
    assert not [line for line in fits["limitations"] if "did not finish" in line]

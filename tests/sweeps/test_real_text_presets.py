"""The real-text study's presets (sweeps/examples/fortunes_*.yaml): what the study needs of them.

Validated as ``ksweep validate`` does (the spec model and the plan), without the model or the
dataset: a spec names both, and they are resolved only when a sweep starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.units import effective_beta
from sweeps.plan.budget import build_plan_within_budget
from sweeps.spec import SweepSpec
from workers.yaml_loader import read_spec_file

EXAMPLES = Path(__file__).resolve().parents[2] / "sweeps" / "examples"
PRESETS = ("fortunes_smollm2.yaml", "fortunes_gru.yaml")
UNDIVIDED = ("uniform", "raw_token_weighted", "concentration_corrected")


def load(name: str) -> SweepSpec:
    return SweepSpec.model_validate(read_spec_file(EXAMPLES / name), strict=True)


@pytest.mark.parametrize("name", PRESETS)
def test_the_preset_is_the_issue_s_design_and_its_plan_has_160_trials(name: str) -> None:
    spec = load(name)
    assert spec.models == ["discrete"] and spec.template.model.num_categories is None  # K = labels
    assert list(spec.alpha) == [0, 1, 2] and spec.seeds == 5
    assert spec.stack_labels() == ["uniform", *UNDIVIDED[1:], "ncc"]
    assert spec.template.data.dataset == "fortunes"
    assert spec.template.data.max_target_length <= 64
    plan = build_plan_within_budget(spec)
    # Per beta and seed: uniform 1, R_tok 2, R~ 2 (alpha 0 is uniform), ncc 3; 4 betas, 5 seeds.
    assert plan.to_dict()["trial_count"] == 160 == spec.budget.max_trials


def test_the_two_presets_differ_in_the_base_only() -> None:
    lm, gru = (load(n).model_dump(mode="json") for n in PRESETS)
    assert lm["template"]["base"]["kind"] == "causal_lm" and lm["template"]["base"]["model"] == "smollm2"
    assert gru["template"]["base"]["kind"] == "learned"
    for dump in (lm, gru):
        for key in ("name", "description"):
            dump.pop(key)
        dump["template"].pop("base")
    assert lm == gru


@pytest.mark.parametrize("c_base", [3.0, 3.5, 4.0, 5.0, 5.01, 8.0, 10.0])
def test_r_hat_is_matched_to_two_undivided_betas_for_any_plausible_c_base(c_base: float) -> None:
    """R^ at beta b trains like an undivided stack at b * c_base; the report interpolates R^
    between its own grid points and never extrapolates, so each undivided beta 0.3 and 1.0
    must lie within R^'s effective-beta range at every alpha > 0."""
    spec = load(PRESETS[0])
    betas = list(spec.beta)
    for alpha in (1.0, 2.0):
        ncc = [effective_beta(spec.stack_spec("ncc", alpha, b), c_base) for b in betas]
        assert ncc == pytest.approx([b * c_base for b in betas])
        for beta in (0.3, 1.0):
            for label in UNDIVIDED:
                undivided = effective_beta(spec.stack_spec(label, alpha, beta), c_base)
                assert undivided == pytest.approx(beta)
                assert min(ncc) <= undivided <= max(ncc)
    # The lowest grid points are R^'s: an undivided 0.03 is never matched (R^ starts at 0.09).
    assert min(betas) * c_base > min(betas)

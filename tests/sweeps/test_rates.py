"""Comparisons at a priced, matched rate, on trial results whose values are known by
construction: the target-rate axis, the achieved rate against its target and its flag, contrasts
at one target rate, the rate-distortion plane (table and PNG), the trained options in cells and
the trials table, and the words where information was credited back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from rich.console import Console

from ksweep.cli.report_view import report_renderables
from ksweep.tables import build_frames
from service.api.schemas import Report
from sweeps import SweepSpec, build_plan
from sweeps.plan.build import trial_key
from sweeps.plan.identity import objective_key
from sweeps.report.build import build_report, report_markdown
from sweeps.report.plots import RD_PLANE_PNG, rd_plane_figure
from sweeps.report.rates import TRAINED_OPTIONS
from sweeps.report.readout_table import TrialOutcome
from tests.sweeps.test_report import _find
from workers.contract import SELECTION_METRIC, off_target

TARGETS = (0.5, 1.0)
# Achieved KL / target per (stack, target): uniform misses 0.5 by 0.84 x (flagged: 16% off,
# more than 15%), raw token weighting reaches 0.9 x (not flagged); both hit 1.0 exactly.
ACHIEVED = {("uniform", 0.5): 0.84, ("raw_token_weighted", 0.5): 0.9,
            ("uniform", 1.0): 1.0, ("raw_token_weighted", 1.0): 1.0}
# Latent NMI: the rate itself, raw token weighting 0.05 above uniform at 0.5 and 0.1 at 1.0.
GAIN = {0.5: 0.05, 1.0: 0.1}


def rate_spec(**fields: Any) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "rates", "template": {"data": {"num_strategies": 4}}, "alpha": [1.0],
        "loss_stacks": ["uniform", "raw_token_weighted"], "seeds": 3,
        "target_rate": list(TARGETS), **fields})


def distortion(stack: str, rate: float) -> float:
    return 3.0 - rate + (0.2 if stack == "raw_token_weighted" else 0.0)


def rate_outcomes(spec: SweepSpec) -> list[TrialOutcome]:
    """Every trial at its target's known ratio; I(x; z) = 0.8 KL; distortion known per cell."""
    outcomes = []
    for index, trial in enumerate(build_plan(spec).trials):
        stack, seed = trial["loss_stack"], trial["seed"]
        rate = trial.get("target_rate", 1.0)
        kl = ACHIEVED.get((stack, rate), 1.0) * rate
        nmi = 0.3 + 0.4 * rate + (GAIN.get(rate, 0.0) if stack == "raw_token_weighted" else 0.0) + 0.01 * seed
        final = {"c_base": 1.0, "selected/epoch": 4,
                 "selected/train/kl_multiplier": 2.0 * rate + 0.1 * seed}
        for split in ("val", "test"):
            final |= {f"selected/{split}/kl": kl, f"selected/{split}/mutual_info": 0.8 * kl,
                      f"selected/{split}/recon_uniform": distortion(stack, rate),
                      f"selected/{split}/latent_nmi": nmi}
        params = {k: trial[k] for k in ("alpha", "loss_stack", "model", "seed", "beta", "target_rate")
                  if k in trial}
        outcomes.append(TrialOutcome(str(index), params, "done", final, {}, epochs=5))
    return outcomes


@pytest.fixture(scope="module")
def rated() -> tuple[SweepSpec, dict[str, Any], list[TrialOutcome]]:
    spec = rate_spec()
    outcomes = rate_outcomes(spec)
    return spec, build_report(spec, "r1", outcomes), outcomes


def _terminal(report: dict[str, Any], width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None)
    for renderable in report_renderables(report, width):
        console.print(renderable)
    return console.export_text()


# --- the axis ---------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "search", "words"), [
    ([0.0, 1.0], "grid", "target_rate: 0 is not a rate"),
    ({"low": 0.0, "high": 2.0}, "random", "target_rate.low must be > 0"),
    ([-1.0], "grid", "target_rate"),
    ([float("inf")], "grid", "target_rate"),
])
def test_a_target_rate_must_be_positive_and_finite(value, search, words):
    with pytest.raises(ValidationError) as caught:
        rate_spec(target_rate=value, search={"kind": search})
    assert words in str(caught.value) and "target_rate" in str(caught.value)


def test_a_swept_target_rate_needs_a_kl_term():
    with pytest.raises(ValidationError, match="target_rate: stack 'uniform' has no kl term"):
        rate_spec(common_terms={})


def test_the_target_rate_axis_reaches_each_trials_kl_and_never_dedups_across_rates():
    spec = rate_spec(alpha=[0.0, 1.0], loss_stacks=["uniform"])
    plan = build_plan(spec)
    # uniform at alpha 0 and 1 is one objective per target rate and seed: 2 rates x 3 seeds.
    assert plan.trials_requested == 12 and plan.trial_count == 6
    assert sorted({t["target_rate"] for t in plan.trials}) == list(TARGETS)
    for trial in plan.trials:
        config = spec.trial_config_for(trial)
        assert config.loss_stack.terms["kl"].options["target_rate"] == trial["target_rate"]
        assert config.name.endswith(f"-r{trial['target_rate']:g}-s{trial['seed']}")
    keys = {objective_key(spec, {**plan.trials[0], "target_rate": rate}) for rate in TARGETS}
    assert len(keys) == 2
    # A run logs target_rate NaN when rate control is off: read as no target rate, not a rate.
    off = {k: v for k, v in plan.trials[0].items() if k != "target_rate"}
    assert trial_key({**off, "target_rate": "nan"}) == trial_key(off)
    assert objective_key(spec, {**off, "target_rate": float("nan")}) == objective_key(spec, off)


def test_tune_gets_the_target_rate_as_a_trial_param():
    from sweeps.tune.search_space import param_space

    spec = rate_spec(resources={"cohort_size": 1})
    space = param_space(spec, build_plan(spec))
    assert "target_rate" in space


# --- achieved against target ------------------------------------------------------------

def test_off_target_is_more_than_15_percent_either_way():
    assert off_target(0.84, 1.0) and off_target(1.16, 1.0) and not off_target(0.86, 1.0) and not off_target(1.14, 1.0)
    assert off_target(1.16, 1.0) and not off_target(1.14, 1.0)
    assert off_target(None, 1.0) is None


def test_each_cell_shows_its_achieved_rate_against_its_target_and_the_flag(rated):
    _, report, _ = rated
    assert len(report["rates"]) == 4
    for (stack, target), ratio in ACHIEVED.items():
        row = _find(report["rates"], loss_stack=stack, target_rate=target)
        assert row["ratio"] == pytest.approx(ratio)
        assert row["achieved_kl"]["mean"] == pytest.approx(ratio * target)
        assert row["achieved_kl"]["values"] == pytest.approx([ratio * target] * 3)
        assert row["achieved_mutual_info"]["mean"] == pytest.approx(0.8 * ratio * target)
        assert row["off_target"] is (ratio == 0.84)
        assert row["seeds_off_target"] == (3 if ratio == 0.84 else 0)
        assert row["kl_multiplier"] == pytest.approx(2.0 * target + 0.1)  # mean over seeds 0-2
    assert any(words.startswith("OFF TARGET: 1 of 4") for words in report["limitations"])
    text = report_markdown(report)
    assert "## Achieved rate against target" in text
    assert "OFF TARGET: more than 15% off the target" in text
    flagged = [line for line in text.splitlines() if "OFF TARGET (3/3 seeds off)" in line]
    assert len(flagged) == 1 and "| uniform | 1 | 0.5 | 0.420" in flagged[0]
    assert "| 0.336 [0.336, 0.336] | 1.100 | OFF TARGET" in flagged[0]
    assert text.count("on target (0/3 seeds off)") == 3
    terminal = _terminal(report)
    assert terminal.count("OFF TARGET (3/3 seeds off)") == 1 and "Achieved rate against" in terminal


def test_contrasts_pair_cells_of_one_target_rate_and_never_across(rated):
    _, report, _ = rated
    stack = [c for c in report["contrasts"] if c["contrast"] == "stack" and c["kind"] == "all"
             and c["metric"] == "latent_nmi"]
    assert sorted(c["target_rate"] for c in stack) == list(TARGETS)
    for entry in stack:
        assert entry["matched_on"] == "target rate"
        assert entry["beta_matching"] == "matched rate (same target rate)"
        assert entry["n_pairs"] == 3 and entry["family"] == "primary"
        assert entry["mean_diff"] == pytest.approx(GAIN[entry["target_rate"]])
        assert entry["diffs"] == pytest.approx([GAIN[entry["target_rate"]]] * 3)
    cell = _find(report["cells"], loss_stack="uniform", target_rate=0.5, split="test", kind="all",
                 metric="latent_nmi")
    assert cell["mean"] == pytest.approx(0.51)  # 0.3 + 0.4 x 0.5 + 0.01 x (mean seed 1)


def test_without_rate_control_contrasts_match_on_beta_as_before():
    spec = rate_spec(target_rate=None, beta=[0.5, 1.0])
    report = build_report(spec, "r0", rate_outcomes(spec))
    assert report["rates"] == []
    entry = _find(report["contrasts"], contrast="stack", beta=0.5, kind="all", metric="latent_nmi")
    assert entry["target_rate"] is None and entry["matched_on"] != "target rate"
    assert "## Achieved rate against target" not in report_markdown(report)


# --- the rate-distortion plane ----------------------------------------------------------

def test_the_rate_distortion_table_holds_each_cells_rate_and_distortion(rated):
    _, report, _ = rated
    plane = report["rd_plane"]
    assert len(plane) == 4
    for (stack, target), ratio in ACHIEVED.items():
        row = _find(plane, loss_stack=stack, target_rate=target)
        assert row["rate_kl"] == pytest.approx(ratio * target)
        assert row["rate_mutual_info"] == pytest.approx(0.8 * ratio * target)
        assert row["distortion"] == pytest.approx(distortion(stack, target))
        assert row["distortion_metric"] == "recon_uniform" and row["recon_uniform"]["n"] == 3
    assert [r["loss_stack"] for r in plane] == ["raw_token_weighted"] * 2 + ["uniform"] * 2
    text = report_markdown(report)
    assert "## Rate-distortion plane (test; mean over seeds)" in text
    assert "| discrete | 1 (target rate 0.5) | uniform | 1 | 0.420 | 0.336 | 2.500 | 3 |" in text
    assert "Rate-distortion plane" in _terminal(report)


def test_the_rate_distortion_png_is_written_as_a_valid_image(rated, tmp_path: Path):
    from matplotlib import image

    _, report, _ = rated
    png = rd_plane_figure(report["rd_plane"], report["split"], tmp_path / RD_PLANE_PNG)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # write_report_plots: tests/sweeps/test_runner.py
    pixels = image.imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 300


# --- what was trained -------------------------------------------------------------------

def test_cells_and_the_trials_table_say_what_each_trial_trained_with(rated):
    _, report, _ = rated
    for cell in report["cells"]:
        assert cell["kl_target_rate"] == cell["target_rate"]
        assert (cell["kl_scale"], cell["kl_weight_units"], cell["kl_free_bits_mode"]) == (
            "example", "beta", "example")
        assert (cell["kl_free_bits"], cell["kl_mutual_info_credit"], cell["kl_anneal"]) == (
            0.0, 0.0, "none")
        assert (cell["prior"], cell["latent_estimator"], cell["selection"]) == (
            "learned", "enumerate", SELECTION_METRIC)
    trials = build_frames(Report.model_validate(report), [], []).trials
    assert set(TRAINED_OPTIONS) <= set(trials.columns)
    assert sorted(trials["kl_target_rate"].unique()) == list(TARGETS)
    assert (trials["kl_target_rate"] == trials["target_rate"]).all()
    assert set(trials["selection"]) == {"val/loss"} and set(trials["prior"]) == {"learned"}


# --- information credited back ----------------------------------------------------------

CREDIT_TERMS = {"kl": {"weight": 1.0, "options": {"mutual_info_credit": 1.0}}}


def test_a_credited_cell_is_said_to_carry_free_information_in_every_report():
    # Credited information cannot be rate-controlled (refused): two betas instead of two rates.
    spec = rate_spec(common_terms=CREDIT_TERMS, target_rate=None, beta=[0.5, 1.0], template={
        "data": {"num_strategies": 4}, "model": {"prior": "standard", "discrete_estimator": "gumbel"}})
    report = build_report(spec, "c1", rate_outcomes(spec))
    assert all(row["information_priced"] is False and row["mutual_info_credit"] == 1.0
               for row in report["latent_use"]["cells"])
    cell = report["cells"][0]
    assert (cell["kl_mutual_info_credit"], cell["prior"], cell["latent_estimator"]) == (
        1.0, "standard", "gumbel")
    words = [w for w in report["limitations"] if w.startswith("UNPRICED INFORMATION")]
    assert len(words) == 1 and "the information z carries was free there" in words[0]
    markdown = report_markdown(report)
    assert markdown.count("in use (3 of 3 seeds in use); information free (unpriced, credit 1)") == 4
    terminal = _terminal(report, width=120)
    # The terminal's coded verdict: "used 3/3 free", the legend saying what free means.
    assert terminal.count("3/3 free") == 4 and "free = trained with the mutual-information credit" in " ".join(terminal.split())
    for text in (markdown, terminal):
        flat = " ".join(text.split())
        assert "UNPRICED INFORMATION: 4 configuration(s)" in flat
        assert flat.count("learned under the ELBO") == flat.count("not a latent learned under the ELBO")


def test_a_priced_sweep_says_nothing_of_free_information(rated):
    _, report, _ = rated
    assert all(row["information_priced"] is True for row in report["latent_use"]["cells"])
    assert "UNPRICED" not in report_markdown(report) and "UNPRICED" not in _terminal(report)

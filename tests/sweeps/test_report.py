"""report.json on synthetic trial results whose statistics are known by construction."""

import json
import math
from typing import Any

import pytest

from sweeps import SweepSpec, build_plan
from sweeps.report.build import build_report, report_markdown, summary_metrics, write_report_plots
from sweeps.report.readout_table import TrialOutcome
from sweeps.report.text import headline

CC = {"name": "concentration_corrected", "terms": {"concentration_corrected": 1.0}}
SEEDS = (0, 1, 2)


def caveat_spec(**fields: Any) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "syn", "template": {"data": {"num_strategies": 2}}, "alpha": [0, 1],
        "loss_stacks": ["uniform", "raw_token_weighted", CC], "seeds": list(SEEDS), **fields})


def _final(values: dict[str, float], *, selected: bool = True) -> dict[str, float]:
    """values: kind -> NMI; logged on val and test (test = val - 0.05)."""
    final: dict[str, float] = {"c_base": 2.0}
    for kind, value in values.items():
        path = "" if kind == "all" else f"{kind}/"
        if selected:
            final["selected/epoch"] = 5
            final[f"selected/val/{path}latent_nmi"] = value
            final[f"selected/test/{path}latent_nmi"] = value - 0.05
        else:
            final[f"val/{path}latent_nmi"] = value
    return final


def known_outcomes(spec: SweepSpec, selected: bool = True, nan_seed: int | None = None):
    """uniform 0.5 + 0.01 s; R_tok (alpha 1) uniform + 0.1 + 0.01 (s - 1); R~ (alpha 1) equal to
    R_tok overall, -0.2 on prefix and +0.1 on private: the interaction is -0.3 on every seed."""
    outcomes = []
    for index, trial in enumerate(build_plan(spec).trials):
        seed, stack = trial["seed"], trial["loss_stack"]
        base = 0.5 + 0.01 * seed
        rtok = base + 0.1 + 0.01 * (seed - 1)
        values = {"uniform": {k: base for k in ("all", "prefix", "private")},
                  "raw_token_weighted": {k: rtok for k in ("all", "prefix", "private")},
                  "concentration_corrected": {"all": rtok, "prefix": rtok - 0.2,
                                              "private": rtok + 0.1}}[stack]
        final = _final(values, selected=selected)
        if nan_seed == seed and stack == "raw_token_weighted":
            final = {k: math.nan if "latent_nmi" in k else v for k, v in final.items()}
        params = {k: trial[k] for k in ("alpha", "loss_stack", "model", "seed")}
        outcomes.append(TrialOutcome(str(index), params, "done", final, {}))
    return outcomes


def _find(entries, **match):
    found = [e for e in entries if all(e.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, len(found))
    return found[0]


def test_cells_fill_every_requested_row_from_shared_trials():
    spec = caveat_spec()
    report = build_report(spec, "s1", known_outcomes(spec))
    json.dumps(report, allow_nan=False)
    assert report["dedup"] == {"trials_requested": 18, "trials_run": 9, "trials_saved_by_dedup": 9,
                               "trials_reused": 0}
    assert report["split"] == "test" and report["readout_source"] == "selected"
    # R_tok at alpha 0 is the uniform trial: the same per-seed values.
    shared = _find(report["cells"], loss_stack="raw_token_weighted", alpha=0.0, split="test",
                   kind="all", metric="latent_nmi")
    assert shared["values"] == pytest.approx([0.45, 0.46, 0.47]) and shared["n"] == 3
    assert "uniform@alpha=0" in shared["shared_with"] and shared["beta"] == 1.0
    # mean 0.46, sd 0.01, t(0.975, 2) 4.302653 / sqrt 3: half-width 0.024841.
    assert shared["mean"] == pytest.approx(0.46)
    assert shared["ci_low"] == pytest.approx(0.435159, abs=1e-6)
    assert shared["ci_high"] == pytest.approx(0.484841, abs=1e-6)


def test_primary_contrasts_are_paired_and_holm_adjusted():
    spec = caveat_spec()
    report = build_report(spec, "s1", known_outcomes(spec))
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    # Each stack against uniform at alpha 1 (alpha 0 is the same trial: not a test).
    assert {(c["loss_stack"], c["alpha"]) for c in primary} == {
        ("raw_token_weighted", 1.0), ("concentration_corrected", 1.0)}
    rtok = _find(primary, loss_stack="raw_token_weighted")
    # diffs 0.09, 0.10, 0.11: mean 0.1, sd 0.01, t = 17.32 with 2 df, p = 0.003316.
    assert rtok["mean_diff"] == pytest.approx(0.1) and rtok["n_pairs"] == 3
    assert rtok["ci_low"] == pytest.approx(0.075159, abs=1e-6)
    assert rtok["p_value"] == pytest.approx(0.003316, abs=1e-5)
    assert rtok["p_adjusted"] == pytest.approx(2 * rtok["p_value"])  # Holm, m = 2, equal p
    assert rtok["claim"].startswith("higher than uniform")
    assert rtok["beta_matching"] == "exact"
    same = _find(report["contrasts"], loss_stack="raw_token_weighted", alpha=0.0, kind="all",
                 contrast="stack", metric="latent_nmi")
    assert same["identical_objective"] and same["family"] == "exploratory"
    assert headline(report).startswith("2 of 2 primary contrasts differ")


def test_caveat_contrasts_and_interaction():
    spec = caveat_spec(analysis={"primary": "caveat"})
    report = build_report(spec, "s1", known_outcomes(spec))
    interaction = _find(report["contrasts"], contrast="interaction")
    assert interaction["mean_diff"] == pytest.approx(-0.3) and interaction["n_pairs"] == 3
    assert interaction["family"] == "primary" and interaction["alpha"] == 1.0
    prefix = _find(report["contrasts"], contrast="caveat", kind="prefix")
    private = _find(report["contrasts"], contrast="caveat", kind="private")
    assert prefix["mean_diff"] == pytest.approx(-0.2) and private["mean_diff"] == pytest.approx(0.1)
    assert {prefix["family"], private["family"]} == {"primary"}
    overall = _find(report["contrasts"], contrast="caveat", kind="all")
    assert overall["family"] == "exploratory" and overall["mean_diff"] == pytest.approx(0.0)
    assert all(c["family"] == "exploratory" for c in report["contrasts"] if c["contrast"] == "stack")


def test_caveat_contrasts_on_the_rate_are_exploratory():
    """R_tok spends 0.7 nats of KL on prefix and 0.6 + 0.1 s on private; R~ none on either: the
    rate contrasts are -0.7 and -(0.6 + 0.1 s), the interaction 0.1 s - 0.1 (mean 0); every one
    exploratory, and the primary family (NMI) is what it was."""
    spec = caveat_spec(analysis={"primary": "caveat"})
    outcomes = known_outcomes(spec)
    for outcome in outcomes:
        stack, seed = outcome.params["loss_stack"], outcome.params["seed"]
        rtok = stack == "raw_token_weighted" and outcome.params["alpha"] == 1.0
        for kind, rate in (("prefix", 0.7), ("private", 0.6 + 0.1 * seed)):
            outcome.final[f"selected/test/{kind}/kl"] = rate if rtok else 0.0
    report = build_report(spec, "s1", outcomes)
    prefix = _find(report["contrasts"], contrast="caveat", kind="prefix", metric="kl")
    private = _find(report["contrasts"], contrast="caveat", kind="private", metric="kl")
    interaction = _find(report["contrasts"], contrast="interaction", metric="kl")
    assert prefix["mean_diff"] == pytest.approx(-0.7) and private["mean_diff"] == pytest.approx(-0.7)
    assert interaction["diffs"] == pytest.approx([-0.1, 0.0, 0.1])
    assert {prefix["family"], private["family"], interaction["family"]} == {"exploratory"}
    assert prefix["claim"].startswith("exploratory")
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    assert {(c["contrast"], c["kind"], c["metric"]) for c in primary} == {
        ("caveat", "prefix", "latent_nmi"), ("caveat", "private", "latent_nmi"),
        ("interaction", "prefix-private", "latent_nmi")}


def test_fewer_than_three_seeds_make_no_claim():
    spec = caveat_spec(seeds=[0, 1])
    report = build_report(spec, "s1", known_outcomes(spec))
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    assert primary and all(c["p_value"] is None and c["p_adjusted"] is None for c in primary)
    assert all(c["claim"].startswith("no claim") for c in primary)
    assert any("fewer than 3" in words for words in report["limitations"])
    assert headline(report).startswith("No claim")


def test_nan_seed_is_counted_and_said():
    spec = caveat_spec()
    report = build_report(spec, "s1", known_outcomes(spec, nan_seed=1))
    cell = _find(report["cells"], loss_stack="raw_token_weighted", alpha=1.0, split="test",
                 kind="all", metric="latent_nmi")
    assert (cell["n"], cell["n_nan"]) == (2, 1) and cell["values"][1] is None
    rtok = _find(report["contrasts"], loss_stack="raw_token_weighted", alpha=1.0, kind="all",
                 contrast="stack", metric="latent_nmi")
    assert (rtok["n_pairs"], rtok["n_nan"]) == (2, 1) and rtok["claim"].startswith("no claim")
    assert any("NaN" in words for words in report["limitations"])


def test_failed_and_stopped_trials_are_excluded_and_counted():
    spec = caveat_spec()
    outcomes = known_outcomes(spec)
    outcomes[0].state = "failed"
    outcomes[1].state, outcomes[1].final = "stopped", {"val/latent_nmi": 0.9}  # ASHA-stopped
    report = build_report(spec, "s1", outcomes)
    assert report["excluded"] == {"failed": 1, "stopped": 1, "unfinished": 0}
    assert report["counts"] == {"done": 7, "failed": 1, "stopped": 1}
    assert any("1 failed, 1 stopped" in words for words in report["limitations"])


def test_best_is_chosen_on_val_with_test_beside_it():
    spec = caveat_spec()
    report = build_report(spec, "s1", known_outcomes(spec))
    (best,) = report["best"]
    assert best["selected"]["alpha"] == 1.0 and best["val"]["mean"] == pytest.approx(0.61)
    assert best["test"]["mean"] == pytest.approx(0.56)  # test = val - 0.05 by construction
    assert best["ties_on_val"]  # R_tok and R~ tie overall


def test_fallback_without_selected_readouts_is_marked():
    spec = caveat_spec()
    report = build_report(spec, "s1", known_outcomes(spec, selected=False))
    assert report["readout_source"] == "final_epoch" and report["split"] == "val"
    assert any(words.startswith("FALLBACK") for words in report["limitations"])
    assert any("No test split" in words for words in report["limitations"])
    assert _find(report["contrasts"], loss_stack="raw_token_weighted", alpha=1.0, kind="all",
                 contrast="stack", metric="latent_nmi")["split"] == "val"


def _beta_grid_outcomes(spec: SweepSpec, c_base: float):
    """NMI = 0.1 * log2(effective beta) + 0.01 * seed for every stack: equal at matched beta."""
    outcomes = []
    for index, trial in enumerate(build_plan(spec).trials):
        scale = c_base if trial["loss_stack"] == "ncc" else 1.0
        effective = trial["beta"] * scale
        value = 0.1 * math.log2(effective) + 0.01 * trial["seed"] + 0.5
        final = {"c_base": c_base, "selected/epoch": 3, "selected/val/latent_nmi": value,
                 "selected/test/latent_nmi": value}
        params = {k: trial[k] for k in ("alpha", "loss_stack", "model", "seed", "beta")}
        outcomes.append(TrialOutcome(str(index), params, "done", final, {}))
    return outcomes


def test_contrasts_at_matched_effective_beta_interpolate_in_log_beta():
    spec = SweepSpec.model_validate({
        "name": "b", "alpha": [1.0], "loss_stacks": ["uniform", "ncc"], "seeds": 3,
        "beta": [0.5, 1.0, 2.0, 4.0]})
    report = build_report(spec, "s2", _beta_grid_outcomes(spec, c_base=3.0))
    contrasts = {c["beta"]: c for c in report["contrasts"] if c["contrast"] == "stack"
                 and c["metric"] == "latent_nmi" and c["kind"] == "all"}
    # ncc's effective betas are 1.5, 3, 6, 12: uniform at beta 2 and 4 lies inside (matched by
    # interpolation, difference 0 by construction); at 0.5 and 1 outside (never extrapolated).
    for beta in (2.0, 4.0):
        assert contrasts[beta]["beta_matching"] == "interpolated (log beta)"
        assert contrasts[beta]["mean_diff"] == pytest.approx(0.0, abs=1e-12)
        assert contrasts[beta]["n_pairs"] == 3
    for beta in (0.5, 1.0):
        assert contrasts[beta]["beta_matching"] == "unmatched"
        assert contrasts[beta]["n_unmatched"] == 3 and contrasts[beta]["mean_diff"] is None
    cell = _find(report["cells"], loss_stack="ncc", beta=2.0, split="test", kind="all",
                 metric="latent_nmi")
    assert cell["beta_effective"] == pytest.approx(6.0)
    # Collapse beta: NMI >= 0.9 needs 0.1 log2(eff) + 0.5 + 0.01 >= 0.9: eff >= 2^3.9 = 14.9.
    collapse = _find(report["collapse"], loss_stack="ncc")
    assert collapse["collapse_beta"] is None and "every beta" in collapse["status"]


def test_collapse_beta_is_the_largest_beta_above_threshold():
    spec = SweepSpec.model_validate({
        "name": "c", "alpha": [1.0], "loss_stacks": ["uniform"], "seeds": 3,
        "beta": [0.25, 0.5, 1.0, 2.0], "analysis": {"collapse_threshold": 0.4}})
    report = build_report(spec, "s3", _beta_grid_outcomes(spec, c_base=2.0))
    # mean NMI at beta b: 0.1 log2 b + 0.51: 0.31, 0.41, 0.51, 0.61 -> all but 0.25 >= 0.4;
    # the largest is the grid's top: censored.
    collapse = _find(report["collapse"], loss_stack="uniform")
    assert collapse["collapse_beta"] == 2.0 and collapse["status"].startswith("censored")
    spec.analysis.collapse_threshold = 0.5
    inside = _find(build_report(spec, "s3", _beta_grid_outcomes(spec, 2.0))["collapse"],
                   loss_stack="uniform")
    assert inside["collapse_beta"] == 2.0
    spec.analysis.collapse_threshold = 0.65
    none = _find(build_report(spec, "s3", _beta_grid_outcomes(spec, 2.0))["collapse"],
                 loss_stack="uniform")
    assert none["collapse_beta"] is None


def test_markdown_plots_and_summary_metrics(tmp_path):
    spec = caveat_spec(analysis={"primary": "caveat"})
    report = build_report(spec, "s1", known_outcomes(spec))
    text = report_markdown(report)
    assert "What this report cannot claim" not in text or "Shared trials" in text
    assert "prefix-private" in text and "-0.300" in text and "Holm" in text
    paths = write_report_plots(report, [], tmp_path)
    names = {p.name for p in paths}
    assert "latent_nmi_vs_alpha__discrete__beta_1__fb_0.png" in names
    assert {"contrasts.png", "interaction.png", "curves_per_alpha.png"} <= names
    metrics = summary_metrics(report)
    assert metrics["final/test/latent_nmi/uniform/discrete/alpha_1/beta_1"] == pytest.approx(0.46)


def test_curve_readouts_are_read_beside_the_selected_values() -> None:
    """The worker logs selected/{split}/... per epoch metric and {split}/nmi_auc once per trial
    (the names in workers.train.selection): the report reads both, and nothing else plain."""
    from sweeps.report.readout_table import trial_readouts

    final = {"selected/epoch": 4, "selected/test/latent_nmi": 0.75, "test/latent_nmi": 0.2,
             "test/nmi_auc": 0.5, "test/prefix/nmi_auc": 0.25, "val/epochs_to_nmi90": 7.0,
             "val/epochs_to_nmi90_censored": 1.0}
    values, source = trial_readouts(final, ["latent_nmi", "nmi_auc", "epochs_to_nmi90",
                                            "epochs_to_nmi90_censored"])
    assert source == "selected"
    assert values == {("test", "all", "latent_nmi"): 0.75, ("test", "all", "nmi_auc"): 0.5,
                      ("test", "prefix", "nmi_auc"): 0.25, ("val", "all", "epochs_to_nmi90"): 7.0,
                      ("val", "all", "epochs_to_nmi90_censored"): 1.0}


def _strip_test(value: Any) -> Any:
    """A report entry without any test-split field: what selection alone decides."""
    if isinstance(value, dict):
        return {k: _strip_test(v) for k, v in value.items() if "test" not in k}
    if isinstance(value, list):
        return [_strip_test(v) for v in value]
    return value


def test_corrupting_the_test_values_changes_no_selection():
    """best and collapse read val only: scrambling every test value (to values that would
    change every choice if test were read) leaves them the same, while the test cells move."""
    spec = SweepSpec.model_validate({
        "name": "c", "alpha": [0.0, 1.0], "loss_stacks": ["uniform", "ncc"], "seeds": 3,
        "beta": [0.25, 0.5, 1.0, 2.0], "analysis": {"collapse_threshold": 0.5}})
    clean = _beta_grid_outcomes(spec, c_base=2.0)
    corrupt = _beta_grid_outcomes(spec, c_base=2.0)
    for index, outcome in enumerate(corrupt):
        outcome.final["selected/test/latent_nmi"] = 1.0 - outcome.final["selected/test/latent_nmi"] \
            + 0.001 * index
    before, after = build_report(spec, "s", clean), build_report(spec, "s", corrupt)
    assert before["best"] and before["collapse"]
    assert _strip_test(after["best"]) == _strip_test(before["best"])
    assert _strip_test(after["collapse"]) == _strip_test(before["collapse"])
    test_means = [c["mean"] for r in (before, after) for c in r["cells"]
                  if c["split"] == "test" and c["metric"] == "latent_nmi" and c["kind"] == "all"]
    half = len(test_means) // 2
    assert test_means[:half] != test_means[half:]


def test_claim_words_say_what_the_numbers_support() -> None:
    """Each verdict in words agrees with its numbers: significant after Holm, an unadjusted
    interval that excludes 0 without Holm significance (not "includes 0"), one that includes 0,
    too few pairs, exploratory."""
    from sweeps.report.contrasts import claim_words

    base = {"family": "primary", "n_pairs": 5, "baseline": "uniform", "beta_matching": "exact"}
    assert claim_words({**base, "mean_diff": 0.04, "ci_low": 0.03, "ci_high": 0.05,
                        "p_adjusted": 0.0176}) == "higher than uniform (Holm p = 0.0176)"
    assert claim_words({**base, "mean_diff": 0.045, "ci_low": 0.019, "ci_high": 0.071,
                        "p_adjusted": 0.213}) == (
        "no significant difference (Holm p = 0.213; the unadjusted 95% interval excludes 0)")
    assert claim_words({**base, "mean_diff": -0.01, "ci_low": -0.04, "ci_high": 0.02,
                        "p_adjusted": 1.0}) == (
        "no significant difference (Holm p = 1; interval includes 0)")
    assert claim_words({**base, "n_pairs": 0, "beta_matching": "unmatched", "mean_diff": None,
                        "ci_low": None, "ci_high": None, "p_adjusted": None}) == (
        "no claim: no matched effective beta")
    assert claim_words({**base, "family": "exploratory", "mean_diff": 0.5, "ci_low": 0.4,
                        "ci_high": 0.6, "p_adjusted": None}).startswith("exploratory")


def test_chance_level_and_collapse_are_said() -> None:
    """A test NMI inside its shuffled-label NMI's interval is counted as chance level; one above
    it is not; a mean test I(x; z) under the threshold is a collapsed latent (whatever its KL);
    val cells are not read."""
    from sweeps.report.latent_use import latent_limitations, latent_use

    def cell(metric: str, mean: float, high: float, stack: str = "ncc", split: str = "test"):
        return {"alpha": 2.0, "loss_stack": stack, "model": "discrete", "beta": 1.0,
                "free_bits": 0.0, "kind": "all", "split": split, "metric": metric, "n": 3,
                "mean": mean, "ci_low": 0.0, "ci_high": high, "values": [mean] * 3}

    cells = [cell("latent_nmi", 0.032, 0.057), cell("latent_nmi_shuffled", 0.027, 0.052),
             cell("latent_nmi", 0.40, 0.45, "uniform"),
             cell("latent_nmi_shuffled", 0.03, 0.05, "uniform"),
             cell("kl", 0.3, 0.31), cell("mutual_info", 0.0004, 0.001),  # free bits: KL, no I
             cell("kl", 2.5, 2.9, "uniform"), cell("mutual_info", 1.1, 1.2, "uniform"),
             cell("mutual_info", 0.0001, 0.0002, "uniform", split="val")]
    use = latent_use(cells, "test", 0.05)
    assert {(row["loss_stack"], row["in_use"], row["seeds_in_use"]) for row in use["cells"]} == {
        ("ncc", False, 0), ("uniform", True, 3)}
    words = latent_limitations(cells, use)
    assert words[0].startswith("1 of 2 test latent_nmi cell(s) are at chance level")
    assert words[1].startswith("1 of 2 cell(s) have a collapsed latent (mean test I(x; z) < 0.05 nats")
    assert latent_limitations([cell("latent_nmi", 0.4, 0.5)], latent_use([], "test", 0.05)) == []


def latent_outcomes(spec: SweepSpec, values: dict[str, tuple[list[float], list[float], list[float]]]):
    """Per stack, per seed: (test NMI, test I(x; z), test AMI); val equal to test."""
    outcomes = []
    for index, trial in enumerate(build_plan(spec).trials):
        seed, stack = trial["seed"], trial["loss_stack"]
        nmi, info, ami = (column[SEEDS.index(seed)] for column in values[stack])
        final: dict[str, float] = {"c_base": 2.0, "selected/epoch": 3}
        for split in ("val", "test"):
            final.update({f"selected/{split}/latent_nmi": nmi, f"selected/{split}/mutual_info": info,
                          f"selected/{split}/latent_ami": ami, f"selected/{split}/kl": info + 0.2,
                          f"selected/{split}/active_units": 4.0 if info > 0.05 else 0.0,
                          f"selected/{split}/used_categories": 4.0})
        params = {k: trial[k] for k in ("alpha", "loss_stack", "model", "seed")}
        outcomes.append(TrialOutcome(str(index), params, "done", final, {}))
    return outcomes


def test_a_contrast_between_collapsed_or_chance_sides_is_never_higher_or_lower():
    """Both sides collapsed (I < 0.05 nats) or both at chance (AMI interval contains 0) on a
    significant NMI difference: the claim says which, never "higher"; the headline makes no
    claim; the ELBO-free latent-use table says collapsed per cell."""
    spec = SweepSpec.model_validate({
        "name": "gate", "template": {"data": {"num_strategies": 2}}, "alpha": [1],
        "loss_stacks": ["uniform", "raw_token_weighted"], "seeds": list(SEEDS)})
    collapsed = {"uniform": ([0.01, 0.02, 0.03], [0.001, 0.0, 0.002], [0.0, 0.01, -0.01]),
                 "raw_token_weighted": ([0.31, 0.32, 0.33], [0.01, 0.02, 0.0], [0.3, 0.32, 0.31])}
    report = build_report(spec, "g", latent_outcomes(spec, collapsed))
    contrast = _find(report["contrasts"], family="primary")
    assert contrast["p_adjusted"] < 0.05 and contrast["mean_diff"] == pytest.approx(0.3)
    assert contrast["treated_latent"] == contrast["baseline_latent"] == "collapsed"
    assert contrast["treated_mutual_info"] == pytest.approx(0.01) and contrast["latent_gated"]
    assert contrast["claim"].startswith("both collapsed (mean test I(x; z) < 0.05 nats on each side)")
    assert headline(report).startswith("No claim: in every primary contrast")
    assert {row["in_use"] for row in report["latent_use"]["cells"]} == {False}
    markdown = report_markdown(report)
    assert "## Latent use (test; in use: mean I(x; z) >= 0.05 nats)" in markdown
    assert "collapsed (0 of 3 seeds in use)" in markdown and "higher than" not in markdown
    # In use on both sides but the AMI at chance on both: "both at chance".
    chance = {"uniform": ([0.01, 0.02, 0.03], [0.5, 0.6, 0.7], [0.01, -0.02, 0.0]),
              "raw_token_weighted": ([0.31, 0.32, 0.33], [0.5, 0.6, 0.7], [0.02, -0.01, 0.0])}
    contrast = _find(build_report(spec, "g", latent_outcomes(spec, chance))["contrasts"], family="primary")
    assert contrast["claim"].startswith("both at chance")
    # A declared threshold of 0: nothing is collapsed, the AMI decides.
    spec0 = spec.model_copy(update={"analysis": spec.analysis.model_copy(update={"latent_in_use_nats": 0.0})})
    contrast = _find(build_report(spec0, "g", latent_outcomes(spec0, collapsed))["contrasts"], family="primary")
    assert contrast["treated_latent"] == "in use" and contrast["claim"].startswith("higher")


def test_a_contrast_against_a_constant_latent_baseline_is_flagged():
    """uniform's latent is constant (I = 0, NMI exactly 0 in every seed: zero variance) and R_tok's
    is in use: the contrast is higher, and flagged as against a constant-latent baseline."""
    spec = SweepSpec.model_validate({
        "name": "flag", "template": {"data": {"num_strategies": 2}}, "alpha": [1],
        "loss_stacks": ["uniform", "raw_token_weighted"], "seeds": list(SEEDS)})
    values = {"uniform": ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]),
              "raw_token_weighted": ([0.61, 0.62, 0.64], [0.5, 0.6, 0.55], [0.6, 0.62, 0.63])}
    report = build_report(spec, "f", latent_outcomes(spec, values))
    contrast = _find(report["contrasts"], family="primary")
    assert contrast["baseline_constant"] and not contrast["latent_gated"]
    assert contrast["treated_latent"] == "in use" and contrast["baseline_latent"] == "collapsed"
    assert contrast["claim"].startswith("higher than uniform (Holm p = ")
    assert "flagged: uniform's latent is constant" in contrast["claim"]
    assert "[flagged: constant-latent baseline]" in headline(report)
    uniform = _find(report["latent_use"]["cells"], loss_stack="uniform")
    assert uniform["in_use"] is False and uniform["mutual_info"]["mean"] == 0.0
    assert uniform["active_units"]["mean"] == 0.0 and uniform["at_chance"]
    assert any("1 of 2 cell(s) have a collapsed latent" in words for words in report["limitations"])
    # ksweep report's terminal view draws the same table, the estimators named under it.
    import io

    from rich.console import Console

    from ksweep.cli.report_view import render_report

    console = Console(file=io.StringIO(), width=600)
    render_report(report, console)
    shown = console.file.getvalue()
    assert "Latent use (test; in use: mean I(x; z) >= 0.05 nats)" in shown
    assert "collapsed (0 of 3 seeds in use); AMI at chance" in shown and "paired mixture estimate" in shown


def test_declared_predictions_and_exploratory_contrasts():
    """R_tok - uniform declared primary and predicted higher (true by construction); R~ -
    uniform declared exploratory: Holm's family is R_tok's alone (m = 1)."""
    spec = caveat_spec(analysis={"contrasts": [
        {"stack": "raw_token_weighted", "baseline": "uniform", "predicted": "higher"},
        {"stack": "concentration_corrected", "baseline": "uniform", "primary": False,
         "predicted": "lower"}]})
    report = build_report(spec, "s1", known_outcomes(spec))
    rtok = _find(report["contrasts"], loss_stack="raw_token_weighted", alpha=1.0, kind="all",
                 contrast="stack", metric="latent_nmi")
    assert rtok["family"] == "primary" and rtok["predicted"] == "higher"
    assert rtok["p_adjusted"] == pytest.approx(rtok["p_value"])  # m = 1
    assert rtok["claim"].startswith("higher than uniform") and "as predicted" in rtok["claim"]
    corrected = _find(report["contrasts"], loss_stack="concentration_corrected", alpha=1.0,
                      kind="all", contrast="stack", metric="latent_nmi")
    assert corrected["family"] == "exploratory" and corrected["predicted"] == "lower"
    assert corrected["claim"].startswith("exploratory") and "predicted lower" in corrected["claim"]
    flipped = caveat_spec(analysis={"contrasts": [
        {"stack": "raw_token_weighted", "baseline": "uniform", "predicted": "lower"}]})
    report = build_report(flipped, "s1", known_outcomes(flipped))
    rtok = _find(report["contrasts"], loss_stack="raw_token_weighted", alpha=1.0, kind="all",
                 contrast="stack", metric="latent_nmi")
    assert "against the prediction (lower)" in rtok["claim"]


def test_the_checkpoint_rule_and_the_last_epoch_counts_are_reported() -> None:
    # every known outcome chose epoch 5: the last epoch of a 5-epoch budget, not of a 10-epoch one
    spec = caveat_spec(template={"data": {"num_strategies": 2}, "training": {
        "epochs": 5, "selection": "val_metric", "selection_metric": "val/latent_ami"}})
    report = build_report(spec, "s1", known_outcomes(spec))
    assert report["selection"]["rule"] == "highest val/latent_ami"
    assert report["selection"]["words"].startswith(
        "each trial's checkpoint is the epoch of highest val/latent_ami (ties: the earlier epoch); "
        "no early stopping (all 5 epochs run)")
    assert {c["last_epoch"] for c in report["cells"]} == {len(SEEDS)}
    text = report_markdown(report)
    assert f"Checkpoint: {report['selection']['words']}" in text
    assert "; uniform alpha 1 discrete beta 1 3/3." in text
    longer = caveat_spec(template={"data": {"num_strategies": 2}, "training": {"patience": 2}})
    report = build_report(longer, "s2", known_outcomes(longer))
    assert {c["last_epoch"] for c in report["cells"]} == {0}
    assert report["selection"]["rule"] == "lowest val/loss"
    assert "early stopping after 2 epoch(s) without val/loss improving" in report["selection"]["words"]
    assert "Chose their last epoch, per cell: none." in report_markdown(report)
    from rich.console import Console

    from ksweep.cli.report_view import render_report

    console = Console(width=200, record=True)
    render_report(report, console)  # ksweep report's terminal view says it too
    terminal = console.export_text()
    assert "Checkpoint: each trial's checkpoint is the epoch of lowest val/loss" in terminal
    assert "Chose their last epoch, per cell: none." in terminal

"""Power by design (sweeps.report.power): the noncentral t power against known values and
against a simulation of paired seeds, the detectable effect, the seeds needed, the section."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy.special import stdtr

from sweeps.report.power import (
    MAX_SEEDS,
    detectable_effect,
    extend_command,
    holm_level,
    paired_power,
    power_entry,
    power_section,
    seed_list_text,
    seeds_needed,
    unused_seeds,
)


def _simulated_power(effect: float, sd: float, n: int, level: float, reps: int,
                     seed: int = 0) -> float:
    """Rejections of the two-sided paired t test over ``reps`` simulated studies of ``n``
    paired seeds: each seed's two sides share a seed effect (cancelled by pairing), their
    difference is ``effect`` plus noise of SD ``sd``."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0.3, 0.5, size=(reps, n))  # the seed's own level, common to both sides
    baseline = shared + rng.normal(0, sd / math.sqrt(2), size=(reps, n))
    treated = shared + effect + rng.normal(0, sd / math.sqrt(2), size=(reps, n))
    diffs = treated - baseline
    t = diffs.mean(axis=1) / (diffs.std(axis=1, ddof=1) / math.sqrt(n))
    p = 2 * stdtr(n - 1, -np.abs(t))
    return float((p < level).mean())


def test_power_matches_a_known_value():
    # pwr.t.test(n = 10, d = 1, sig.level = 0.05, type = "one.sample"): power 0.8031.
    assert paired_power(1.0, 1.0, 10, 0.05) == pytest.approx(0.8031, abs=2e-4)
    # At effect 0 the test rejects at its level: the power is the size.
    assert paired_power(0.0, 0.04, 5, 0.0125) == pytest.approx(0.0125, rel=1e-6)


@pytest.mark.parametrize(("effect", "sd", "n", "level"), [
    (0.05, 0.04, 5, 0.0125),   # the WordNet case: four primary contrasts, five seeds
    (0.03, 0.04, 20, 0.0125),
    (0.03, 0.04, 12, 0.05),
])
def test_power_agrees_with_a_simulation_of_paired_seeds(effect, sd, n, level):
    start = time.perf_counter()
    simulated = _simulated_power(effect, sd, n, level, reps=40_000)
    assert time.perf_counter() - start < 2.0
    # 40 000 studies: the simulation's SE is at most 0.0025.
    assert simulated == pytest.approx(paired_power(effect, sd, n, level), abs=0.015)


def test_the_normal_approximation_would_overstate_power_at_five_seeds():
    from scipy.special import ndtr, ndtri

    level, n, sd, effect = 0.0125, 5, 0.04, 0.08
    z = ndtri(1 - level / 2)
    normal = float(ndtr(effect / sd * math.sqrt(n) - z))
    assert normal - paired_power(effect, sd, n, level) > 0.2


def test_detectable_effect_has_the_declared_power_and_shrinks_with_seeds():
    sd, level = 0.04, 0.0125
    d5 = detectable_effect(sd, 5, level)
    assert paired_power(d5, sd, 5, level) == pytest.approx(0.8, abs=1e-6)
    assert paired_power(d5 * 0.99, sd, 5, level) < 0.8
    d20 = detectable_effect(sd, 20, level)
    assert d20 < d5
    # Many seeds: the normal formula (z_{1-a/2} + z_{0.8}) sd / sqrt(n) holds.
    from scipy.special import ndtri

    n = 4000
    normal = (ndtri(1 - level / 2) + ndtri(0.8)) * sd / math.sqrt(n)
    assert detectable_effect(sd, n, level) == pytest.approx(normal, rel=2e-3)
    assert detectable_effect(0.0, 5, level) == 0.0


def test_seeds_needed_is_the_first_n_with_enough_power():
    sd, level, effect = 0.04, 0.0125, 0.03
    n = seeds_needed(effect, sd, level)
    assert n is not None
    assert paired_power(effect, sd, n, level) >= 0.8 > paired_power(effect, sd, n - 1, level)
    # A large effect needs no more than the report's minimum of 3 pairs.
    assert seeds_needed(1.0, 0.01, 0.05) == 3
    assert seeds_needed(1e-6, 1.0, 0.05) is None  # beyond MAX_SEEDS
    with pytest.raises(ValueError, match="effect must be > 0"):
        seeds_needed(0.0, 0.04, 0.05)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_power(0.1, 0.04, 1, 0.05)


def test_holm_level_and_the_extend_command():
    assert holm_level(4) == pytest.approx(0.0125)
    assert holm_level(0) == pytest.approx(0.05)
    assert unused_seeds([0, 1, 3], 3) == [2, 4, 5]
    assert extend_command("abc123", range(5), 3) == "ksweep extend abc123 --seeds 5-7"
    assert extend_command("abc123", [0, 2], 3) == "ksweep extend abc123 --seeds 1,3,4"
    assert seed_list_text([9, 5, 6, 7, 12, 13]) == "5-7,9,12,13"


def _contrast(diffs, family="primary", p=0.2, **keys):
    return {"contrast": "stack", "loss_stack": "a", "baseline": "b", "alpha": 1.0,
            "model": "discrete", "beta": 1.0, "free_bits": None, "kind": "all",
            "metric": "latent_ami", "family": family, "p_value": p, "diffs": diffs, **keys}


def test_power_section_per_primary_contrast_and_the_command():
    noisy = [0.02, -0.05, 0.06, -0.01, 0.04]
    quiet = [0.01, 0.012, 0.009, 0.011, 0.010]
    contrasts = [_contrast(noisy), _contrast(quiet, alpha=2.0),
                 _contrast(noisy, family="exploratory")]
    section = power_section(contrasts, 0.03, {"s1": [0, 1, 2, 3, 4]})
    assert section["family_size"] == 2 and section["level"] == pytest.approx(0.025)
    first, second = section["entries"]
    assert first["paired_sd"] == pytest.approx(float(np.std(noisy, ddof=1)))
    assert first["n_pairs"] == 5
    assert first["detectable"] == pytest.approx(detectable_effect(first["paired_sd"], 5, 0.025))
    needed = seeds_needed(0.03, first["paired_sd"], 0.025)
    assert first["seeds_needed"] == needed and first["seeds_to_add"] == needed - 5
    assert second["seeds_to_add"] == 0
    assert section["seeds_needed"] == needed
    added = seed_list_text(range(5, needed))
    assert section["extend"] == [f"ksweep extend s1 --seeds {added}"]
    # Not extendable (Optuna, ASHA): a new sweep instead; no min_effect: no seeds needed.
    assert power_section(contrasts, 0.03, {"s1": [0]}, extendable=False)["extend"] == []
    bare = power_section(contrasts, None, {"s1": [0]})
    assert bare["entries"][0]["seeds_needed"] is None and bare["extend"] == []


def test_power_entry_with_too_few_pairs_says_why():
    entry = power_entry([0.1], 0.05, 0.03)
    assert entry["paired_sd"] is None and "2 needed" in entry["note"]
    assert MAX_SEEDS >= 10_000


# ---- the spec's analysis.min_effect and the report's power section ------------------------------

def test_min_effect_is_validated_naming_the_field():
    from pydantic import ValidationError

    from sweeps import SweepSpec

    base = {"name": "t"}
    assert SweepSpec.model_validate(base).analysis.resolved_min_effect() is None  # NMI: none
    ami = SweepSpec.model_validate({**base, "analysis": {"metric": "latent_ami"}})
    assert ami.analysis.resolved_min_effect() == pytest.approx(0.03)
    declared = {**base, "analysis": {"metric": "latent_ami", "min_effect": 0.05}}
    assert SweepSpec.model_validate(declared).analysis.resolved_min_effect() == 0.05
    for bad in (0, -0.1, math.inf, math.nan):
        with pytest.raises(ValidationError) as caught:
            SweepSpec.model_validate({**base, "analysis": {"min_effect": bad}})
        error = caught.value.errors()[0]
        assert error["loc"] == ("analysis", "min_effect")
        assert "analysis.min_effect must be a positive finite" in error["msg"]


def test_the_report_prints_power_for_each_primary_contrast():
    from sweeps.report.build import build_report, report_markdown
    from tests.sweeps.test_report import caveat_spec, known_outcomes

    spec = caveat_spec(analysis={"min_effect": 0.005})
    report = build_report(spec, "s1", known_outcomes(spec))
    power = report["power"]
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    assert power["family_size"] == len(primary) == 2
    assert power["level"] == pytest.approx(0.025) and power["min_effect"] == 0.005
    rtok = next(e for e in power["entries"] if e["loss_stack"] == "raw_token_weighted")
    # diffs 0.09, 0.10, 0.11: SD 0.01 over 3 pairs.
    assert rtok["paired_sd"] == pytest.approx(0.01) and rtok["n_pairs"] == 3
    assert rtok["seeds_needed"] == seeds_needed(0.005, 0.01, 0.025)
    to_add = rtok["seeds_needed"] - 3
    assert power["extend"] == [extend_command("s1", [0, 1, 2], to_add)]
    text = report_markdown(report)
    assert "## Power by design (the primary family)" in text
    assert "paired SD 0.010" in text and power["extend"][0] in text


# ---- ksweep validate SPEC --pilot: the same figures before anything runs -----------------------

WORDNET = "docs/science/real_text_wordnet"


def test_validate_with_a_pilot_gives_the_seeds_before_anything_runs(monkeypatch):
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from ksweep.cli import app

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    runner = CliRunner()
    result = runner.invoke(app, ["validate", "sweeps/examples/wordnet_nouns.yaml", "--pilot",
                                 f"{WORDNET}/nouns/report.json", "--json"])
    assert result.exit_code == 0, result.output
    power = json.loads(result.output)["power"]
    # The spec plans the pilot's own four primary contrasts at its five seeds: the report's figures.
    report = json.loads((root / WORDNET / "nouns" / "report.json").read_text())
    seeds = sorted({t["seed"] for t in report["trials"]})
    after = power_section(report["contrasts"], 0.03, {"x": seeds})
    assert power["family_size"] == 4 and power["seeds"] == 5
    assert [e["seeds_needed"] for e in power["entries"]] == [
        e["seeds_needed"] for e in after["entries"]]
    assert [e["sd_from"] for e in power["entries"]] == ["pilot"] * 4
    assert power["seeds_needed"] == after["seeds_needed"]
    shown = runner.invoke(app, ["validate", "sweeps/examples/wordnet_nouns.yaml", "--pilot",
                                f"{WORDNET}/nouns/report.json"], env={"COLUMNS": "200"})
    assert f"seeds: {power['seeds_needed']} (the spec has 5)" in shown.output
    other = runner.invoke(app, ["validate", "sweeps/examples/quickstart.yaml", "--pilot",
                                f"{WORDNET}/nouns/report.json"], env={"COLUMNS": "200"})
    assert other.exit_code == 2 and "analysis.metric" in other.output


# ---- the caveat interaction across two sweeps (two datasets or label sets) ----------------------

def _across_outcomes(spec, shift):
    """known_outcomes with R~'s all-examples value moved by ``shift(seed)`` (val and test):
    R~ - R_tok over all examples is then ``shift(seed)`` at every alpha > 0."""
    from tests.sweeps.test_report import known_outcomes

    outcomes = known_outcomes(spec)
    for outcome in outcomes:
        if outcome.params["loss_stack"] == "concentration_corrected" and outcome.params["alpha"] > 0:
            for key in ("selected/val/latent_nmi", "selected/test/latent_nmi"):
                outcome.final[key] += shift(outcome.params["seed"])
    return outcomes


def test_the_caveat_interaction_across_two_sweeps_is_primary_paired_by_seed():
    from sweeps.report.build import build_report
    from sweeps.report.compare import IncompatibleSweeps, compare_report
    from tests.sweeps.test_report import caveat_spec

    analysis = {"primary": "caveat_across", "min_effect": 0.01, "contrasts": [
        {"stack": "concentration_corrected", "baseline": "raw_token_weighted", "predicted": "lower"}]}
    first = caveat_spec(analysis=analysis)
    second = caveat_spec(template={"data": {"num_strategies": 3}}, analysis={
        **analysis, "contrasts": [{"stack": "concentration_corrected",
                                   "baseline": "raw_token_weighted", "predicted": "higher"}]})
    outcomes = {"a": _across_outcomes(first, lambda s: -0.05 - 0.01 * s),
                "b": _across_outcomes(second, lambda s: 0.02 * s)}
    # One side alone: R~ - R_tok over all examples is its primary family.
    own = build_report(first, "a", outcomes["a"])
    side = [c for c in own["contrasts"] if c["family"] == "primary"]
    assert [(c["contrast"], c["kind"], c["alpha"]) for c in side] == [("caveat", "all", 1.0)]
    assert side[0]["diffs"] == pytest.approx([-0.05, -0.06, -0.07])
    report = compare_report({"a": first, "b": second}, outcomes, {"a": "nouns", "b": "adjadv"})
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    assert len(primary) == 1
    across = primary[0]
    # Per seed: (-0.05 - 0.01 s) - 0.02 s = -0.05, -0.08, -0.11: mean -0.08, SD 0.03.
    assert across["contrast"] == "interaction_across" and across["kind"] == "nouns - adjadv"
    assert across["diffs"] == pytest.approx([-0.05, -0.08, -0.11]) and across["seeds"] == [0, 1, 2]
    assert across["mean_diff"] == pytest.approx(-0.08)
    assert across["p_adjusted"] == pytest.approx(across["p_value"])  # m = 1
    assert across["predicted"] == "lower"  # lower on the first side, higher on the second
    assert across["claim"].startswith("lower") and "as predicted" in across["claim"]
    power = report["power"]["entries"][0]
    assert power["paired_sd"] == pytest.approx(0.03)
    assert power["seeds_needed"] == seeds_needed(0.01, 0.03, 0.05)
    assert report["power"]["extend"][0].startswith("ksweep extend a --seeds 3-")
    assert report["power"]["extend"][1].startswith("ksweep extend b --seeds 3-")
    # Anything but the data and the declared contrasts still refuses, naming the field.
    other = caveat_spec(template={"training": {"epochs": 4}}, analysis=analysis)
    with pytest.raises(IncompatibleSweeps) as raised:
        compare_report({"a": first, "b": other}, {"a": outcomes["a"], "b": outcomes["a"]},
                       {"a": "x", "b": "y"})
    assert [field for field, _ in raised.value.problems] == ["template.training.epochs"]


def test_the_wordnet_interaction_recomputes_from_the_committed_reports():
    import json
    from pathlib import Path

    from sweeps.report.across import across_report

    root = Path(__file__).resolve().parents[2] / WORDNET
    nouns, adjadv = (json.loads((root / name / "report.json").read_text())
                     for name in ("nouns", "adjadv"))
    report = across_report([nouns, adjadv], {nouns["sweep_id"]: range(5), adjadv["sweep_id"]: range(5)})
    at_one = next(c for c in report["contrasts"] if c["family"] == "primary" and c["alpha"] == 1.0)
    # Nouns -0.025 minus adj/adv -0.009 at alpha 1: -0.016 [-0.098, +0.065].
    assert at_one["mean_diff"] == pytest.approx(-0.0165, abs=5e-4)
    assert at_one["ci_low"] == pytest.approx(-0.098, abs=1e-3)
    assert at_one["ci_high"] == pytest.approx(0.065, abs=1e-3)


# ---- predictions: declared at submission, judged as first declared ------------------------------

def test_predictions_are_recorded_once_and_a_changed_one_is_marked(tmp_path):
    from datetime import datetime

    from sweeps.report.build import build_report, report_markdown
    from sweeps.report.predictions import record_predictions
    from tests.sweeps.test_report import caveat_spec, known_outcomes

    def declared(sign):
        return caveat_spec(analysis={"contrasts": [
            {"stack": "raw_token_weighted", "baseline": "uniform", "predicted": sign}]})

    first = declared("higher")
    record = record_predictions(tmp_path, first, datetime(2026, 12, 7, 9, 30))
    assert record["submitted_at"] == "2026-12-07T09:30:00+00:00"
    report = build_report(first, "s1", known_outcomes(first), predictions=record)
    assert report["predictions"]["submitted_at"] == record["submitted_at"]
    assert report["predictions"]["contrasts"][0]["changed"] is False
    assert "as predicted" in next(c for c in report["contrasts"] if c["family"] == "primary")["claim"]
    text = report_markdown(report)
    assert "Declared at submission (2026-12-07T09:30:00+00:00)" in text
    assert "raw_token_weighted - uniform: higher (primary)" in text
    # The spec edited on a resume: the record is not rewritten, and the report judges the
    # contrast on its first prediction and says it changed.
    edited = declared("lower")
    again = record_predictions(tmp_path, edited, datetime(2026, 12, 8))
    assert again == record
    report = build_report(edited, "s1", known_outcomes(edited), predictions=again)
    rtok = next(c for c in report["contrasts"] if c["family"] == "primary")
    assert rtok["predicted"] == "higher" and rtok["predicted_now"] == "lower"
    assert rtok["prediction_changed"] is True
    assert "as predicted" in rtok["claim"] and "prediction changed after the first segment" in rtok["claim"]
    assert report["predictions"]["contrasts"][0]["changed"] is True
    assert any("changed after the first segment ran" in w for w in report["limitations"])
    assert "CHANGED after the first segment ran: the spec now says lower" in report_markdown(report)


def test_the_committed_wordnet_power_table_is_what_the_script_makes_now(monkeypatch):
    """docs/science/real_text_wordnet/power.md regenerates byte for byte, and the paired
    differences it reads from report.json are the trials table's own (selected test AMI; a
    stack whose objective does not depend on alpha ran once, at alpha 0: dedup)."""
    import csv
    import io
    import json
    from contextlib import redirect_stdout
    from pathlib import Path

    from tests.support.scripts import load_script

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    out = io.StringIO()
    with redirect_stdout(out):
        assert load_script("power_table.py").main(
            [f"{WORDNET}/nouns/report.json", f"{WORDNET}/adjadv/report.json"]) == 0
    assert out.getvalue() == (root / WORDNET / "power.md").read_text()
    for name in ("nouns", "adjadv"):
        rows = list(csv.DictReader((root / WORDNET / name / "trials.csv").open()))
        ami = {(r["loss_stack"], float(r["alpha"]), int(r["seed"])): float(r["selected/test/latent_ami"])
               for r in rows}

        def at(stack, alpha, seed, ami=ami):
            return ami.get((stack, alpha, seed), ami.get((stack, 0.0, seed)))

        report = json.loads((root / WORDNET / name / "report.json").read_text())
        primary = [c for c in report["contrasts"] if c["family"] == "primary"]
        assert len(primary) == 4
        for c in primary:
            expected = [at(c["loss_stack"], c["alpha"], s) - at(c["baseline"], c["alpha"], s)
                        for s in c["seeds"]]
            assert c["diffs"] == pytest.approx(expected, abs=1e-9)


def test_a_joined_report_adds_seeds_to_each_sweep_compared():
    from sweeps.report.compare import compare_report
    from tests.sweeps.test_report import caveat_spec, known_outcomes

    first = caveat_spec(analysis={"min_effect": 0.005})
    second = caveat_spec(analysis={"min_effect": 0.005}, seeds=[3, 4])
    outcomes = {"a": known_outcomes(first), "b": known_outcomes(second)}
    for sweep, items in outcomes.items():
        for outcome in items:
            outcome.trial_id = f"{sweep}-{outcome.trial_id}"
    report = compare_report({"a": first, "b": second}, outcomes, {"a": "one", "b": "two"})
    commands = report["power"]["extend"]
    assert [c.split(" --seeds ")[0] for c in commands] == ["ksweep extend a", "ksweep extend b"]
    assert all(c.split(" --seeds ")[1].startswith("5-") for c in commands)  # seeds 0-4 ran


def test_power_stays_finite_where_scipys_lower_tail_gives_nan():
    # Two pairs, an effect 30 SDs out: scipy's noncentral t CDF returns NaN for the lower tail
    # there (it is ~0); the power is the upper tail alone, 1 - P(T <= c) = 0.99913 (scipy.stats.nct).
    power = paired_power(0.03, 0.001, 2, 0.05)
    assert math.isfinite(power) and power == pytest.approx(1 - 0.0008724058153932409, abs=1e-9)
    assert math.isfinite(detectable_effect(0.001, 2, 0.0125))

"""Sweeps that grow, without training: the union spec and its refusals, the marked plan, the
report's statistics after growth, sweeps compared, and a segment's files."""

import pytest
from pydantic import ValidationError

from sweeps import SweepSpec, build_plan
from sweeps.plan.build import subplan
from sweeps.plan.growth import ExtensionRequest, extend_spec, extension_plan
from sweeps.plan.identity import objective_key
from sweeps.report.build import build_report
from sweeps.report.compare import IncompatibleSweeps, compare_report, joined_spec
from sweeps.report.growth import EXTENDED_WORDS
from sweeps.report.readout_table import TrialOutcome
from sweeps.spec import load_sweep_spec
from sweeps.tune.segments import Segment, load_segments, tune_folder, write_outcomes, write_segment
from tests.service.conftest import QUICKSTART
from tests.sweeps.test_report import _find, caveat_spec, known_outcomes


@pytest.fixture(scope="module")
def quickstart() -> SweepSpec:
    return load_sweep_spec(QUICKSTART)


def _refused(spec: SweepSpec, **request) -> dict[str, str]:
    with pytest.raises(ValidationError) as raised:
        extend_spec(spec, ExtensionRequest(**request))
    return {".".join(str(p) for p in e["loc"]): e["msg"] for e in raised.value.errors()}


def _with(spec: SweepSpec, **fields) -> SweepSpec:
    return SweepSpec.model_validate({**spec.model_dump(mode="json"), **fields})


def test_two_more_seeds_add_ten_trials_to_quickstart(quickstart):
    grown = extend_spec(quickstart, ExtensionRequest(seeds=[3, 4]))
    assert grown.seed_list() == [0, 1, 2, 3, 4] and grown.alpha == quickstart.alpha
    marked = extension_plan(quickstart, grown)
    assert (marked.rows_before, marked.rows_new) == (27, 18)
    assert (marked.trials_before, marked.trials_existing, marked.trials_new) == (15, 15, 10)
    assert marked.added == {"seeds": [3, 4]}
    new = [t for t in marked.plan.trials if not t["exists"]]
    assert sorted({t["seed"] for t in new}) == [3, 4]


def test_a_new_alpha_adds_no_uniform_trial(quickstart):
    grown = extend_spec(quickstart, ExtensionRequest(alpha=[0.5]))
    assert grown.alpha == [0.0, 1.0, 2.0, 0.5]  # old values first: the trials keep their rows
    marked = extension_plan(quickstart, grown)
    new = [t for t in marked.plan.trials if not t["exists"]]
    # raw token weighting and R~ at 0.5, three seeds each; uniform at 0.5 is the uniform trial.
    assert sorted((t["loss_stack"], t["alpha"]) for t in new) == sorted(
        [("raw_token_weighted", 0.5)] * 3 + [("concentration_corrected", 0.5)] * 3)
    uniform_rows = [r for r in marked.plan.rows if r["new"] and r["loss_stack"] == "uniform"]
    assert len(uniform_rows) == 3 and all(marked.plan.trials[r["trial"]]["exists"]
                                          for r in uniform_rows)
    assert marked.notes and marked.notes[0].startswith("3 new row(s)")


def test_a_new_stack_and_values_already_there(quickstart):
    grown = extend_spec(quickstart, ExtensionRequest(loss_stacks=["uniform", "ncc"], seeds=[2, 3],
                                                     alpha=[1, 4]))
    assert grown.stack_labels() == ["uniform", "raw_token_weighted", "concentration_corrected", "ncc"]
    assert grown.seed_list() == [0, 1, 2, 3] and grown.alpha == [0.0, 1.0, 2.0, 4.0]
    assert extension_plan(quickstart, grown).added == {
        "seeds": [3], "alpha": [4.0], "loss_stacks": ["ncc"]}


def test_refusals_name_their_field(quickstart):
    assert "template.training.epochs" in _refused(
        quickstart, seeds=[3], template={"training": {"epochs": 20}})
    assert "template.data.dataset" in _refused(
        quickstart, seeds=[3], template={"data": {"dataset": "dialogues"}})
    # The same value as the sweep's is no change.
    assert extend_spec(quickstart, ExtensionRequest(seeds=[3], template={"training": {"epochs": 8}}))
    assert "beta" in _refused(quickstart, beta=[2.0])
    assert "unknown" in _refused(quickstart, seeds=[3], colour="blue")["colour"]
    assert "adds no new value" in _refused(quickstart, seeds=[0, 1])[""]
    other = {"name": "concentration_corrected", "terms": {"uniform": 1.0}}
    assert "another definition" in _refused(quickstart, loss_stacks=[other])["loss_stacks.0"]
    optuna = _with(quickstart, alpha={"low": 0, "high": 2}, search={"kind": "optuna"}, seeds=1)
    assert "Optuna" in _refused(optuna, seeds=[3])["search.kind"]
    asha = _with(quickstart, scheduler={"kind": "asha"}, resources={"cohort_size": 1})
    assert "ASHA" in _refused(asha, seeds=[3])["scheduler.kind"]
    random = _with(quickstart, alpha={"low": 0, "high": 2}, search={"kind": "random",
                                                                    "num_samples": 2})
    assert "seeds only" in _refused(random, alpha=[0.5], loss_stacks=["ncc"])["alpha"]
    assert "seeds only" in _refused(random, loss_stacks=["ncc"])["loss_stacks"]
    grown = extend_spec(random, ExtensionRequest(seeds=[3]))
    before, after = build_plan(random), build_plan(grown)
    # The drawn points are the same: each runs at the new seed too.
    assert [(r["alpha"], r["loss_stack"]) for r in after.rows if r["seed"] == 3] == [
        (r["alpha"], r["loss_stack"]) for r in before.rows if r["seed"] == 0]


def test_an_extension_past_the_trial_cap_is_refused(quickstart):
    capped = _with(quickstart, budget={"max_trials": 20, "max_concurrent_trials": 2})
    grown = extend_spec(capped, ExtensionRequest(seeds=[3, 4]))
    with pytest.raises(ValidationError) as raised:
        extension_plan(capped, grown)
    assert raised.value.errors()[0]["loc"] == ("budget", "max_trials")


EXTENSION = {"number": 1, "added": {"seeds": [3], "alpha": [0.5]}, "primary": False,
             "after_report": {"number": 1, "headline": "2 of 2 primary contrasts differ"},
             "state_before": "succeeded", "requested_at": "2026-12-06T10:00:00+00:00",
             "rows": {"before": 18, "after": 36}, "trials": {"before": 9, "after": 16, "new": 7}}


def _grown_report(primary: bool):
    spec = caveat_spec()
    grown = extend_spec(spec, ExtensionRequest(seeds=[3], alpha=[0.5]))
    return build_report(grown, "s1", known_outcomes(grown),
                        extensions=[{**EXTENSION, "primary": primary}])


def test_a_grown_report_keeps_its_first_primary_family_and_marks_grown_contrasts():
    report = _grown_report(primary=False)
    assert report["extensions"][0]["added"] == {"seeds": [3], "alpha": [0.5]}
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    assert {(c["loss_stack"], c["alpha"]) for c in primary} == {
        ("raw_token_weighted", 1.0), ("concentration_corrected", 1.0)}
    rtok = _find(primary, loss_stack="raw_token_weighted")
    # Seed 3 came after report 1 was seen: n grew from 3 to 4.
    assert rtok["n_pairs"] == 4 and rtok["extended"] and rtok["added_by_extension"] is None
    assert rtok["claim"].startswith("higher than uniform") and rtok["claim"].endswith(EXTENDED_WORDS)
    # Holm over the two first-declared contrasts only.
    assert rtok["p_adjusted"] == pytest.approx(2 * rtok["p_value"])
    new = _find(report["contrasts"], loss_stack="raw_token_weighted", alpha=0.5, kind="all",
                contrast="stack", metric="latent_nmi")
    assert new["family"] == "exploratory" and new["added_by_extension"] == 1
    assert not new["extended"] and new["n_pairs"] == 4  # every seed from its start: a fixed n
    assert new["claim"].startswith("exploratory: added by extension 1, not declared primary")
    words = " ".join(report["limitations"])
    assert "extended 1 time(s)" in words and "after report 1" in words and EXTENDED_WORDS in words


def test_an_extension_may_declare_its_contrasts_primary_before_they_run():
    report = _grown_report(primary=True)
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    assert {(c["loss_stack"], c["alpha"]) for c in primary} == {
        ("raw_token_weighted", 1.0), ("concentration_corrected", 1.0),
        ("raw_token_weighted", 0.5), ("concentration_corrected", 0.5)}
    assert all(c["p_adjusted"] >= c["p_value"] for c in primary)


def test_compared_sweeps_join_their_axes_and_pair_by_seed():
    first = caveat_spec(loss_stacks=["uniform", "raw_token_weighted"])
    second = caveat_spec(loss_stacks=["uniform", {"name": "concentration_corrected",
                                                  "terms": {"concentration_corrected": 1.0}}],
                         seeds=[1, 2, 3], alpha=[1, 2])
    joined = joined_spec({"a": first, "b": second})
    assert joined.stack_labels() == ["uniform", "raw_token_weighted", "concentration_corrected"]
    assert joined.seed_list() == [0, 1, 2, 3] and joined.alpha == [0.0, 1.0, 2.0]
    outcomes = {"a": known_outcomes(first), "b": known_outcomes(second)}
    for sweep, items in outcomes.items():
        for outcome in items:
            outcome.trial_id = f"{sweep}-{outcome.trial_id}"
    report = compare_report({"a": first, "b": second}, outcomes, {"a": "one", "b": "two"})
    assert [c["sweep_id"] for c in report["compared"]] == ["a", "b"] and report["name"] == "one + two"
    # uniform seeds 1 and 2 ran in both: read from a; seed 3 only in b.
    uniform = [t for t in report["trials"] if t["loss_stack"] == "uniform"]
    assert sorted((t["seed"], t["sweep_id"]) for t in uniform) == [
        (0, "a"), (1, "a"), (2, "a"), (3, "b")]
    cc = _find(report["contrasts"], loss_stack="concentration_corrected", alpha=1.0, kind="all",
               contrast="stack", metric="latent_nmi")
    # R~ (sweep b, seeds 1-3) against uniform (a's seeds 1, 2 and b's seed 3): three pairs,
    # diffs 0.1 + 0.01 (s - 1).
    assert cc["seeds"] == [1, 2, 3] and cc["n_pairs"] == 3
    assert cc["diffs"] == pytest.approx([0.10, 0.11, 0.12])
    assert any("ran in more than one sweep" in w for w in report["limitations"])
    # 6 + 9 trials, 2 of them twice; the joined grid (alpha 0, 1, 2 x seeds 0-3) has 20, of
    # which 7 ran nowhere: R_tok at 1 for seed 3 and at 2 for every seed, R~ for seed 0.
    assert report["dedup"]["trials_run"] == 13
    assert any(w.startswith("7 trial(s) of the joined grid ran in no sweep")
               for w in report["limitations"])
    keys = {objective_key(joined, t) for t in report["trials"]}
    assert len(keys) == len(report["trials"])  # one trial per objective, model and seed


def test_incompatible_sweeps_are_refused_naming_every_differing_field():
    first = caveat_spec()
    other = caveat_spec(template={"data": {"num_strategies": 3}, "training": {"epochs": 4}},
                        analysis={"metric": "latent_ari"}, beta=[0.5, 1.0])
    with pytest.raises(IncompatibleSweeps) as raised:
        joined_spec({"a": first, "b": other})
    fields = dict(raised.value.problems)
    assert {"template.data.num_strategies", "template.training.epochs", "analysis.metric",
            "beta"} <= set(fields)
    assert fields["template.training.epochs"] == "10 in a, 4 in b"
    renamed = caveat_spec(loss_stacks=["uniform", {"name": "raw_token_weighted",
                                                   "terms": {"concentration_corrected": 1.0}}])
    with pytest.raises(IncompatibleSweeps) as raised:
        joined_spec({"a": first, "b": renamed})
    assert dict(raised.value.problems).keys() == {"loss_stacks.raw_token_weighted"}
    # Bookkeeping differs freely.
    assert joined_spec({"a": first, "b": caveat_spec(name="other", budget={"max_trials": 9},
                                                     reuse="own")})


def test_segment_files_round_trip_and_a_segment_plan_regroups_its_trials(tmp_path, quickstart):
    plan = build_plan(quickstart)
    trials = plan.trials[:5]
    part = subplan(quickstart, plan, trials)
    assert part.trial_count == 5 and sorted(i for c in part.cohorts for i in c) == list(range(5))
    assert part.cohort_size == 3 and len(part.rows) == len(plan.rows)  # auto: ceil(5 / 2 workers)
    segment = Segment(1, trials, [{"trial": plan.trials[5], "run_id": "r", "sweep_id": "s",
                                   "experiment_id": "1", "trial_id": "t"}], {"torch_version": "x"})
    write_segment(tmp_path, segment)
    (loaded,) = load_segments(tmp_path)
    assert (loaded.trials, loaded.reused, loaded.finished) == (trials, segment.reused, False)
    outcome = TrialOutcome("t1", {"alpha": 1.0}, "done", {"x": float("nan")}, {"h": [1.0]},
                           trial_hash="h")
    write_outcomes(tmp_path, loaded, [outcome])
    (again,) = load_segments(tmp_path)
    assert again.finished and again.outcomes[0].trial_hash == "h"
    assert tune_folder(0) == "tune" and tune_folder(2) == "tune-2"


def test_segments_trained_under_different_environments_are_named():
    from sweeps.tune.segment_run import environment_words

    same = {"torch_version": "2.13.0", "code_digest": "a"}
    segments = [Segment(0, [{}], environment=same), Segment(1, [{}], environment=same)]
    assert environment_words(segments) == []
    segments.append(Segment(2, [{}], environment={**same, "torch_version": "2.14.0"}))
    segments.append(Segment(3, [], environment={**same, "code_digest": "b"}))  # reused only
    (words,) = environment_words(segments)
    assert "(torch_version differ between segments 0, 1, 2)" in words

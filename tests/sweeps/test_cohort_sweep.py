"""Cohorts in real sweeps (local Ray, sqlite MLflow): a member is the trial it would be alone.

The float64 step-by-step equivalence of the cohort engine is tests/workers/test_cohort.py;
here the whole product path runs in float32: plan -> one Tune trial per cohort -> one MLflow
run per member -> progress -> report, against the same sweep at cohort size 1.
"""

import json
import os
import signal
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient
from test_runner import _runs, _sweep, _write_spec

from sweeps.plan.build import build_plan
from sweeps.spec import load_sweep_spec
from sweeps.status import read_status
from sweeps.tune.cohort_trainable import COHORT_TAG
from tests.support.tune_state import wait_restorable
from workers.cohort.memory import HEADROOM, MEMORY_CAP_ENV, member_step_bytes
from workers.contract import SWEEP_ID_TAG, TRIAL_ID_TAG
from workers.tracking.runs import CREATE_TOKEN_TAG
from workers.train.loop import Trainer

pytestmark = pytest.mark.slow

EARLY_STOPPING = {
    "template.data.train_size": 256, "template.data.val_size": 128,
    "template.training.epochs": 6, "template.training.patience": 1,
    "template.training.min_epochs": 2, "template.training.learning_rate": 0.01,
    "alpha": [1], "seeds": 2, "tracking.trial_plots": True,
    "loss_stacks": ["uniform", "raw_token_weighted",
                    {"name": "concentration_corrected", "terms": {"concentration_corrected": 1.0}}],
}
TRIAL_PLOTS = {f"plots/{name}.png" for name in (
    "kappa_histogram_train", "kappa_histogram_val", "kappa_histogram_test",
    "reconstruction_curves", "position_profiles_val")}
COMPARED = ("selected/epoch", "training/stop_epoch", "selected/test/latent_nmi",
            "selected/test/loss", "selected/val/loss", "selected/test/kl", "selected/test/kappa_mean",
            "selected/test/prefix/latent_nmi", "val/nmi_auc")


def _by_trial(children):
    return {(c.data.params["loss_stack"], c.data.params["seed"]): c for c in children}


def _report(tmp_path, sweep_id):
    return json.loads((tmp_path / "root" / sweep_id / "report.json").read_text())


@pytest.mark.timeout(1800)
def test_cohort_members_match_lone_trials_early_stopping_included(tmp_path):
    # The lone reference pins cohort_size 1 (the default, auto, would pack these 6 trials).
    lone = _write_spec(tmp_path, "lone", {**EARLY_STOPPING, "resources.cohort_size": 1})
    packed = _write_spec(tmp_path, "packed", {**EARLY_STOPPING, "resources.cohort_size": 6})
    # The cohort of 6 gets memory for 3 members, so it trains as two chunks each epoch (as a
    # GPU worker short of memory does): every member still matches its lone trial.
    chunked = {MEMORY_CAP_ENV: f"{_step_mib(packed) * 3 / HEADROOM + 0.01:.3f}"}
    for spec, sweep_id, env in ((packed, "k6", chunked), (lone, "k1", None)):
        started = time.monotonic()
        process = _sweep(tmp_path, spec, sweep_id, env=env, num_cpus=1)
        output, _ = process.communicate(timeout=1700)
        print(f"{sweep_id} wall time {time.monotonic() - started:.0f} s")  # a figure for docs/bench/
        assert process.returncode == 0, output
    _check_same_trials(tmp_path)
    _, _, _, members = _runs(tmp_path, "quickstart", "k6")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    first_epoch = [client.get_metric_history(c.info.run_id, "perf/cohort_size")[0].value for c in members]
    assert first_epoch == [3.0] * 6  # each member trained in a chunk of 3


def _step_mib(spec_path):
    """MiB one member of this spec's cohort plans for in a training step (its first trial's)."""
    spec = load_sweep_spec(spec_path)
    config = spec.trial_config(1.0, spec.trial_configs().stack_labels()[0], spec.models[0], 0)
    return member_step_bytes(Trainer.create(config, spec_path.parent / "estimate")) / 2**20


def _check_same_trials(tmp_path):
    client, _, _, alone = _runs(tmp_path, "quickstart", "k1")
    _, _, _, members = _runs(tmp_path, "quickstart", "k6")
    # One MLflow trial run per member, as many as the lone sweep has, each its own trial id.
    assert len(alone) == len(members) == 6
    assert len({c.data.tags[TRIAL_ID_TAG] for c in members}) == 6
    assert len({c.data.tags[COHORT_TAG] for c in members}) == 1
    assert not any(COHORT_TAG in c.data.tags for c in alone)
    alone, members = _by_trial(alone), _by_trial(members)
    assert alone.keys() == members.keys()
    stopped_early = 0
    for key, lone_run in alone.items():
        member = members[key]
        assert member.info.status == lone_run.info.status == "FINISHED"
        # The same tags a lone trial's run gets (ids and each run's create token aside).
        same_tags = {k: v for k, v in lone_run.data.tags.items() if k.startswith("ksweep.")
                     and k not in (TRIAL_ID_TAG, SWEEP_ID_TAG, CREATE_TOKEN_TAG)}
        assert {k: member.data.tags.get(k) for k in same_tags} == same_tags
        for name in ("c_base", "alpha", "loss_stack", "seed", "training.learning_rate",
                     "train_target_length", "total_steps", "elbo_beta"):
            assert member.data.params[name] == lone_run.data.params[name], name
        # Early stopping on val loss ends the member where it ends the lone trial.
        for name in COMPARED:
            assert member.data.metrics[name] == pytest.approx(
                lone_run.data.metrics[name], rel=1e-4, abs=1e-5), (key, name)
        stop = int(lone_run.data.metrics["training/stop_epoch"])
        stopped_early += stop < 6
        for run in (lone_run, member):
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "val/loss")]
            assert steps == list(range(1, stop + 1)), (key, steps)
        for run in (member, lone_run):  # tracking.trial_plots: all five, member and lone alike
            assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == TRIAL_PLOTS
    assert stopped_early >= 1, "the spec must exercise early stopping"
    # The report and the progress count members as trials, in the same states.
    report1, report6 = _report(tmp_path, "k1"), _report(tmp_path, "k6")
    assert report6["counts"] == report1["counts"] and sum(report6["counts"].values()) == 6
    assert report6["readout_source"] == report1["readout_source"] == "selected"
    states = lambda r: sorted((t["loss_stack"], t["seed"], t["state"], t["epochs"]) for t in r["trials"])  # noqa: E731
    assert states(report6) == states(report1)
    assert {t["mlflow_run_id"] for t in report6["trials"]} == {c.info.run_id for c in members.values()}
    cells = lambda r: {(c["loss_stack"], c["metric"], c["kind"], c["split"]): c["mean"]  # noqa: E731
                       for c in r["cells"] if c["mean"] is not None}
    assert cells(report6).keys() == cells(report1).keys()
    for key, value in cells(report1).items():
        assert cells(report6)[key] == pytest.approx(value, rel=1e-3, abs=1e-4), key
    # Beta in ELBO units from each trial's logged constants, lone and member alike.
    elbo = lambda r: {(c["loss_stack"], c["metric"], c["kind"], c["split"]): c["beta_elbo"]  # noqa: E731
                      for c in r["cells"]}
    assert elbo(report6) == elbo(report1) and all(v and v > 0 for v in elbo(report1).values())
    status1 = read_status(tmp_path / "root" / "k1" / "status.json")
    status6 = read_status(tmp_path / "root" / "k6" / "status.json")
    counters = lambda s: (s.state, s.total, s.done, s.stopped, s.failed, s.pending, len(s.trials))  # noqa: E731
    assert counters(status6) == counters(status1)
    assert status6.total == 6 and len({t["trial_id"] for t in status6.trials}) == 6


@pytest.mark.timeout(1800)
def test_killed_cohort_sweep_resumes_without_rerunning_or_duplicating_members(tmp_path):
    # 6 trials (uniform, raw_plus_ncc, exploding x 2 seeds) in cohorts of 3, one at a time:
    # cohort 1 = both uniform and raw_plus_ncc seed 0; cohort 2 = raw_plus_ncc seed 1 and the
    # two exploding members, which diverge at step 0 (failed with the reason, cohort goes on).
    # 30 epochs: the surviving member of cohort 2 must still be training 2.5 s after its
    # cohort-mates diverged (at 8 epochs, ~0.3 s each, it sometimes finished first).
    epochs = 30
    spec = _write_spec(tmp_path, "resume", {
        "template.training.epochs": epochs, "alpha": [1.0], "seeds": 2,
        "loss_stacks": ["uniform", "raw_plus_ncc",
                        {"name": "exploding", "terms": {"token_weighted": 1e38, "uniform": 1e38}}],
        "budget.max_concurrent_trials": 1, "resources.cohort_size": 3})
    process = _sweep(tmp_path, spec, "kc")
    status_path = tmp_path / "root" / "kc" / "status.json"
    deadline = time.time() + 600
    while time.time() < deadline:
        status = read_status(status_path)
        if status is not None and status.done >= 3 and status.failed >= 2:
            break
        time.sleep(0.5)
    else:
        process.kill()
        pytest.fail("the first cohort did not finish and the second diverge in time")
    time.sleep(2.5)  # let Tune save its experiment state (TUNE_GLOBAL_CHECKPOINT_S = 2)
    wait_restorable(tmp_path / "root" / "kc" / "tune")
    os.killpg(process.pid, signal.SIGKILL)  # the driver and its local Ray die together
    process.wait()
    killed = read_status(status_path)
    assert killed.running >= 1 and killed.total == 6, "the kill must hit a running member"
    _, _, _, before = _runs(tmp_path, "quickstart", "kc")
    ended_before = {c.info.run_id: c for c in before if c.info.status in ("FINISHED", "FAILED")}
    assert len(ended_before) >= 5
    running_before = {c.info.run_id for c in before if c.info.status == "RUNNING"}
    assert len(running_before) == 1  # raw_plus_ncc seed 1, past its first reported epoch
    restarted = _sweep(tmp_path, spec, "kc")
    output, _ = restarted.communicate(timeout=900)
    assert restarted.returncode == 0, output
    client, _, parents, children = _runs(tmp_path, "quickstart", "kc")
    assert len(parents) == 1, "the resumed driver must reuse the parent run"
    trial_ids = [c.data.tags[TRIAL_ID_TAG] for c in children]
    assert len(children) == 6 and len(set(trial_ids)) == 6, "no member may have two MLflow runs"
    assert len({c.data.tags[COHORT_TAG] for c in children}) == 2
    # The running member resumed from its checkpoint into its own run.
    assert running_before <= {c.info.run_id for c in children}
    # Ended members were not re-run: their runs were not touched after the kill.
    for run_id, old in ended_before.items():
        new = next(c for c in children if c.info.run_id == run_id)
        assert (new.info.status, new.info.end_time) == (old.info.status, old.info.end_time)
    for child in children:
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val/loss")]
        if child.data.params["loss_stack"] == "exploding":
            assert child.info.status == "FAILED" and steps == []
            assert "TrialDiverged" in child.data.tags["ksweep.failure"]
            assert "at step 0" in child.data.tags["ksweep.failure"]
        else:
            assert child.info.status == "FINISHED"
            assert steps == list(range(1, epochs + 1)), (child.data.tags[TRIAL_ID_TAG], steps)
            assert "selected/test/latent_nmi" in child.data.metrics
    report = _report(tmp_path, "kc")
    assert report["counts"] == {"done": 4, "failed": 2}
    failed = [t for t in report["trials"] if t["state"] == "failed"]
    assert {t["loss_stack"] for t in failed} == {"exploding"}
    assert all("TrialDiverged" in t["error"] for t in failed)
    status = read_status(status_path)
    assert (status.state, status.total, status.done, status.failed, status.pending) == (
        "succeeded", 6, 4, 2, 0)
    assert yaml.safe_load(spec.read_text())["resources"]["cohort_size"] == 3


@pytest.mark.timeout(1200)
def test_random_sweep_runs_the_planned_points_in_cohorts_and_a_cohort_of_one_alone(tmp_path):
    # 3 random points (seed 7) in cohorts of 2: [trial 1, trial 2] as a cohort, [trial 3]
    # alone, by the lone trainable.
    spec = _write_spec(tmp_path, "random", {
        "alpha": {"low": 0.0, "high": 2.0}, "seeds": 1,
        "search": {"kind": "random", "num_samples": 3, "seed": 7},
        "loss_stacks": ["uniform", "raw_token_weighted", "raw_plus_ncc"],
        "template.training.epochs": 2, "template.data.train_size": 256,
        "template.data.val_size": 128, "budget.max_concurrent_trials": 1,
        "resources.cohort_size": 2})
    plan = build_plan(load_sweep_spec(spec))
    assert plan.cohorts == [[0, 1], [2]]
    process = _sweep(tmp_path, spec, "rnd")
    output, _ = process.communicate(timeout=1100)
    assert process.returncode == 0, output
    client, _, _, children = _runs(tmp_path, "quickstart", "rnd")
    assert len(children) == 3 and all(c.info.status == "FINISHED" for c in children)
    # Each run is the plan's drawn point, exactly (MLflow keeps the float's repr).
    runs = {(float(c.data.params["alpha"]), c.data.params["loss_stack"]): c for c in children}
    assert set(runs) == {(t["alpha"], t["loss_stack"]) for t in plan.trials}
    members = [runs[(t["alpha"], t["loss_stack"])] for t in plan.trials]
    assert members[0].data.tags[COHORT_TAG] == members[1].data.tags[COHORT_TAG]
    assert members[0].data.tags[TRIAL_ID_TAG].endswith("-m0")
    assert COHORT_TAG not in members[2].data.tags  # the cohort of one ran as a lone trial
    assert not members[2].data.tags[TRIAL_ID_TAG].endswith("-m0")
    for child in children:
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val/loss")]
        assert steps == [1, 2] and "selected/test/latent_nmi" in child.data.metrics
    report = _report(tmp_path, "rnd")
    assert report["counts"] == {"done": 3}
    assert sorted(t["alpha"] for t in report["trials"]) == sorted(t["alpha"] for t in plan.trials)
    status = read_status(tmp_path / "root" / "rnd" / "status.json")
    assert (status.state, status.total, status.done, len(status.trials)) == ("succeeded", 3, 3, 3)

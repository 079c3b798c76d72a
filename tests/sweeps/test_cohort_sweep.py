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
from test_runner import SMALL_DATA, _runs, _sweep, _write_spec

from sweeps.plan.build import build_plan
from sweeps.spec import load_sweep_spec
from sweeps.status import read_status
from sweeps.tune.member_runs import COHORT_TAG
from tests.support.tune_state import cohort_trial_id, wait_restorable
from workers.cohort.memory import HEADROOM, member_step_bytes
from workers.contract import SWEEP_ID_TAG, TRIAL_ID_TAG
from workers.settings import MEMORY_CAP_ENV
from workers.tracking.runs import CREATE_TOKEN_TAG
from workers.train.loop import Trainer

pytestmark = pytest.mark.slow

# 4 trials: the uniform baseline and R~ (a stack of terms) x 2 paired seeds; R~ seed 0 stops
# at epoch 5 of 6 on this data (train and val do not depend on the test split's size).
EARLY_STOPPING = {
    **SMALL_DATA, "template.training.epochs": 6, "template.training.patience": 1,
    "template.training.min_epochs": 2, "template.training.learning_rate": 0.01,
    "alpha": [1], "seeds": 2, "tracking.trial_plots": True,
    "loss_stacks": ["uniform",
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
    # The lone reference pins cohort_size 1 (the default, auto, would pack these 4 trials).
    lone = _write_spec(tmp_path, "lone", {**EARLY_STOPPING, "resources.cohort_size": 1})
    packed = _write_spec(tmp_path, "packed", {**EARLY_STOPPING, "resources.cohort_size": 4})
    # The cohort of 4 gets memory for 2 members, so it trains as two chunks each epoch (as a
    # GPU worker short of memory does): every member still matches its lone trial.
    chunked = {MEMORY_CAP_ENV: f"{_step_mib(packed) * 2 / HEADROOM + 0.01:.3f}"}
    for spec, sweep_id, env in ((packed, "k4", chunked), (lone, "k1", None)):
        started = time.monotonic()
        process = _sweep(tmp_path, spec, sweep_id, env=env, num_cpus=1)
        output, _ = process.communicate(timeout=1700)
        print(f"{sweep_id} wall time {time.monotonic() - started:.0f} s")  # a figure for docs/bench/
        assert process.returncode == 0, output
    _check_same_trials(tmp_path)
    _, _, _, members = _runs(tmp_path, "quickstart", "k4")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    first_epoch = [client.get_metric_history(c.info.run_id, "perf/cohort_size")[0].value for c in members]
    assert first_epoch == [2.0] * 4  # each member trained in a chunk of 2


def _step_mib(spec_path):
    """MiB one member of this spec's cohort plans for in a training step (its first trial's)."""
    spec = load_sweep_spec(spec_path)
    config = spec.trial_config(1.0, spec.trial_configs().stack_labels()[0], spec.models[0], 0)
    return member_step_bytes(Trainer.create(config, spec_path.parent / "estimate")) / 2**20


def _check_same_trials(tmp_path):
    client, _, _, alone = _runs(tmp_path, "quickstart", "k1")
    _, _, _, members = _runs(tmp_path, "quickstart", "k4")
    # One MLflow trial run per member, as many as the lone sweep has, each its own trial id.
    assert len(alone) == len(members) == 4
    assert len({c.data.tags[TRIAL_ID_TAG] for c in members}) == 4
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
    report1, report4 = _report(tmp_path, "k1"), _report(tmp_path, "k4")
    assert report4["counts"] == report1["counts"] and sum(report4["counts"].values()) == 4
    assert report4["readout_source"] == report1["readout_source"] == "selected"
    states = lambda r: sorted((t["loss_stack"], t["seed"], t["state"], t["epochs"]) for t in r["trials"])  # noqa: E731
    assert states(report4) == states(report1)
    assert {t["mlflow_run_id"] for t in report4["trials"]} == {c.info.run_id for c in members.values()}
    cells = lambda r: {(c["loss_stack"], c["metric"], c["kind"], c["split"]): c["mean"]  # noqa: E731
                       for c in r["cells"] if c["mean"] is not None}
    assert cells(report4).keys() == cells(report1).keys()
    for key, value in cells(report1).items():
        assert cells(report4)[key] == pytest.approx(value, rel=1e-3, abs=1e-4), key
    # Beta in ELBO units from each trial's logged constants, lone and member alike.
    elbo = lambda r: {(c["loss_stack"], c["metric"], c["kind"], c["split"]): c["beta_elbo"]  # noqa: E731
                      for c in r["cells"]}
    assert elbo(report4) == elbo(report1) and all(v and v > 0 for v in elbo(report1).values())
    status1 = read_status(tmp_path / "root" / "k1" / "status.json")
    status4 = read_status(tmp_path / "root" / "k4" / "status.json")
    counters = lambda s: (s.state, s.total, s.done, s.stopped, s.failed, s.pending, len(s.trials))  # noqa: E731
    assert counters(status4) == counters(status1)
    assert status4.total == 4 and len({t["trial_id"] for t in status4.trials}) == 4


@pytest.mark.timeout(1800)
def test_killed_cohort_sweep_resumes_without_rerunning_or_duplicating_members(tmp_path):
    # 6 trials (uniform, exploding, raw_plus_ncc x 2 seeds) in cohorts of 3, one at a time:
    # cohort 1 = both uniform and exploding seed 0; cohort 2 = exploding seed 1 and both
    # raw_plus_ncc. The exploding members diverge at step 0 (failed with the reason, the cohort
    # goes on). Killed once Tune's saved state names cohort 2's checkpoint (cohort 1 TERMINATED
    # in it), which takes status.json's 1 s lag, an epoch and Tune's next save (every 2 s): 16
    # epochs of a cohort of two on the whole data outlast that with seconds to spare alone (a
    # loaded machine slows the epochs, not the saves). One CPU: the cohorts run one after
    # another in one reused actor.
    epochs = 16
    spec = _write_spec(tmp_path, "resume", {
        "template.training.epochs": epochs, "template.data.test_size": 128, "alpha": [1.0],
        "seeds": 2, "loss_stacks": [
            "uniform", {"name": "exploding", "terms": {"token_weighted": 1e38, "uniform": 1e38}},
            "raw_plus_ncc"],
        "budget.max_concurrent_trials": 1, "resources.cohort_size": 3})
    process = _sweep(tmp_path, spec, "kc", num_cpus=1)
    status_path = tmp_path / "root" / "kc" / "status.json"
    deadline = time.time() + 600
    while time.time() < deadline:
        status = read_status(status_path)
        running = {cohort_trial_id(t["trial_id"]) for t in status.trials
                   if t["state"] == "running"} if status is not None else set()
        if running and status.done >= 2 and status.failed >= 2:
            break
        if process.poll() is not None:
            pytest.fail(f"the sweep ended before cohort 2 could be killed: {process.stdout.read()}")
        time.sleep(0.1)
    else:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("the first cohort did not finish and the second diverge in time")
    (cohort_2,) = running  # its Tune trial id
    restorable = wait_restorable(tmp_path / "root" / "kc" / "tune", limit_s=120, naming=cohort_2,
                                 driver=process)
    os.killpg(process.pid, signal.SIGKILL)  # the driver and its local Ray die together
    process.wait()
    assert restorable, "cohort 2 ended before Tune saved a state naming its checkpoint"
    killed = read_status(status_path)
    assert killed.running >= 1 and killed.total == 6, "the kill must hit a running member"
    _, _, _, before = _runs(tmp_path, "quickstart", "kc")
    ended_before = {c.info.run_id: c for c in before if c.info.status in ("FINISHED", "FAILED")}
    assert len(ended_before) >= 4
    running_before = {c.info.run_id for c in before if c.info.status == "RUNNING"}
    assert len(running_before) == 2  # both raw_plus_ncc, past their first reported epoch
    restarted = _sweep(tmp_path, spec, "kc", num_cpus=1)
    output, _ = restarted.communicate(timeout=900)
    assert restarted.returncode == 0, output
    client, _, parents, children = _runs(tmp_path, "quickstart", "kc")
    assert len(parents) == 1, "the resumed driver must reuse the parent run"
    trial_ids = [c.data.tags[TRIAL_ID_TAG] for c in children]
    assert len(children) == 6 and len(set(trial_ids)) == 6, "no member may have two MLflow runs"
    assert len({c.data.tags[COHORT_TAG] for c in children}) == 2
    # The running members resumed from their checkpoint into their own runs.
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
    # alone, by the lone trainable; one after another on one CPU.
    spec = _write_spec(tmp_path, "random", {
        "alpha": {"low": 0.0, "high": 2.0}, "seeds": 1,
        "search": {"kind": "random", "num_samples": 3, "seed": 7},
        "loss_stacks": ["uniform", "raw_token_weighted", "raw_plus_ncc"],
        "template.training.epochs": 2, **SMALL_DATA, "budget.max_concurrent_trials": 1,
        "resources.cohort_size": 2})
    plan = build_plan(load_sweep_spec(spec))
    assert plan.cohorts == [[0, 1], [2]]
    process = _sweep(tmp_path, spec, "rnd", num_cpus=1)
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

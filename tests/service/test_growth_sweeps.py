"""Sweeps that grow, trained for real: a real ``ksweep serve``, its local drivers and Ray, a
sqlite MLflow store. A finished sweep extended (only new trials run, one run each, under the
same parent run) with its driver killed with SIGKILL in the middle of the extension, a second
sweep reusing the first's trials by content hash and extended while it runs, and the two
compared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from conftest import ROOT, TOKENS, spec_dict
from mlflow.tracking import MlflowClient
from sweep_checks import wait_for_sweep

from ksweep import Client
from tests.support.mlflow_store import sqlite_store_uri
from tests.support.tune_state import cohort_trial_id, wait_restorable
from workers.contract import RUN_KIND_SWEEP, RUN_KIND_TAG, RUN_KIND_TRIAL, TRIAL_HASH_TAG

pytestmark = pytest.mark.slow

# The kill window runs from a restorable Tune state of the extension to the extension's end, its
# two cohorts trained one by one at about 0.3 s an epoch on an idle machine. The test sees it up
# to 1.3 s late (progress is published once a second) and Tune saves its state every 2 s: 6
# epochs left about 1.5 s to spare at worst, 10 leave about 4 s.
EPOCHS = 10
SMALL = {"template.training.epochs": EPOCHS, "template.data.train_size": 256,
         "template.data.val_size": 128}


def _spec(name: str, **changes) -> dict:
    return spec_dict(**{"name": name, **SMALL, **changes})


def _wait(client: Client, sweep_id: str, until, timeout_s: float = 900.0, what: str = ""):
    return wait_for_sweep(lambda: client.get(sweep_id), until, what, timeout_s,
                          state_of=lambda s: s.state, every_s=0.3)


def _ended(client: Client, sweep_id: str, what: str):
    sweep = _wait(client, sweep_id, lambda s: s.state == "succeeded", what=what)
    assert sweep.counters.done == sweep.counters.total, sweep.counters
    return sweep


def _runs(tracking_uri: str, sweep_id: str):
    """The sweep's parent runs and its trial runs (active ones: a deleted leftover is gone)."""
    mlflow = MlflowClient(tracking_uri=tracking_uri)
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    runs = mlflow.search_runs(experiments, f"tags.`ksweep.sweep_id` = '{sweep_id}'")
    parents = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RUN_KIND_SWEEP]
    trials = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RUN_KIND_TRIAL]
    return parents, trials


def _one_run_per_trial(trials, count: int) -> None:
    assert len(trials) == count, len(trials)
    assert Counter(r.data.tags["ksweep.trial_id"] for r in trials).most_common(1)[0][1] == 1
    assert all(r.info.status == "FINISHED" for r in trials)
    assert len({r.data.tags[TRIAL_HASH_TAG] for r in trials}) == count  # each its own content


def _cell(report: dict, stack: str, alpha: float, metric: str = "latent_nmi") -> dict:
    (cell,) = [c for c in report["cells"] if c["loss_stack"] == stack and c["alpha"] == alpha
               and c["kind"] == "all" and c["metric"] == metric and c["split"] == report["split"]]
    return cell


def _contrast(report: dict, stack: str, alpha: float) -> dict:
    (entry,) = [c for c in report["contrasts"] if c["contrast"] == "stack" and c["kind"] == "all"
                and c["loss_stack"] == stack and c["alpha"] == alpha
                and c["metric"] == report["analysis"]["metric"]]
    return entry


def test_grow_reuse_and_compare(make_service, tmp_path):
    # One Ray CPU: each driver's cohorts train one after the other in one reused actor.
    service = make_service(KSWEEP_MAX_CONCURRENT_SWEEPS="1", KSWEEP_DRIVER_NUM_CPUS="1")
    uri = sqlite_store_uri(tmp_path)
    client = Client(service.url.removesuffix("/api/v1"), TOKENS["alice"])
    # 2 alphas x {uniform, R_tok} x 2 seeds: 8 rows, 4 trials (R_tok at 0 is uniform).
    first = client.submit(_spec("grow-first", alpha=[0, 1], seeds=2,
                                loss_stacks=["uniform", "raw_token_weighted"])).id
    ended = _ended(client, first, "the first sweep")
    parents, before = _runs(uri, first)
    _one_run_per_trial(before, 4)
    first_report = client.report_json(first)

    # One more seed and alpha 0.5: 5 new trials (seed 2's uniform and R_tok at 1, R_tok at 0.5
    # for three seeds); uniform at 0.5 is the uniform trial. Its driver is killed with SIGKILL
    # once Tune's state of the extension is restorable; the service's restart resumes it.
    grown = client.extend(first, seeds=[2], alpha=[0.5], idempotency_key="grow-1")
    assert grown.extension.trials == {"before": 4, "after": 9, "new": 5}
    assert grown.extension.after_report["number"] == 1 and grown.sweep.state == "queued"
    running = _wait(client, first, lambda s: s.state == "running" and s.driver.attempts == 1
                    and (s.driver.handle or "").startswith("pid:"), what="the extension")
    # Killed mid-training: once an extension trial has trained an epoch and Tune's saved state
    # names its cohort's checkpoint.
    first_ids, deadline = {r.data.tags["ksweep.trial_id"] for r in before}, time.monotonic() + 600
    while not (training := [t.trial_id for t in client.trials(first, state="running")
                            if t.trial_id not in first_ids and (t.epochs or 0) >= 1]):
        assert time.monotonic() < deadline, client.trials(first)
        time.sleep(0.3)
    wait_restorable(tmp_path / "root" / first / "tune-1", limit_s=600,
                    naming=cohort_trial_id(training[0]))
    os.kill(int(running.driver.handle[4:].split("@")[0]), signal.SIGKILL)
    ended = _ended(client, first, "the resumed extension")
    assert ended.driver.attempts == 2
    assert ended.counters.total == 9 and ended.mlflow.parent_run_id == parents[0].info.run_id
    parents, after = _runs(uri, first)
    assert len(parents) == 1
    _one_run_per_trial(after, 9)
    history = MlflowClient(uri)
    for run in after:  # no epoch lost or logged twice across the kill
        steps = [m.step for m in history.get_metric_history(run.info.run_id, "val/loss")]
        assert steps == list(range(1, EPOCHS + 1)), (run.data.tags["ksweep.trial_id"], steps)
    old = {r.info.run_id: r for r in before}
    for run in after:  # the first four were not run again: their runs are untouched
        if run.info.run_id in old:
            assert run.info.end_time == old[run.info.run_id].info.end_time
    assert len(set(old) & {r.info.run_id for r in after}) == 4
    uniform = [r for r in after if r.data.tags["ksweep.loss_stack"] == "uniform"]
    assert len(uniform) == 3  # one per seed, whatever the alphas
    report = client.report_json(first)
    assert [e["added"] for e in report["extensions"]] == [{"seeds": [2], "alpha": [0.5]}]
    # 3 alphas x 2 stacks x 3 seeds; 3 trials a seed (uniform once for every alpha).
    assert report["dedup"] == {"trials_requested": 18, "trials_run": 9,
                               "trials_saved_by_dedup": 9, "trials_reused": 0}
    assert _cell(report, "raw_token_weighted", 1.0)["n"] == 3
    assert _cell(report, "uniform", 0.5)["n"] == 3 and _cell(report, "uniform", 0.5)["shared_with"]
    grown_contrast = _contrast(report, "raw_token_weighted", 1.0)
    assert grown_contrast["family"] == "primary" and grown_contrast["extended"]
    assert grown_contrast["claim"].endswith("extended: not a fixed-n interval")
    new_contrast = _contrast(report, "raw_token_weighted", 0.5)
    assert new_contrast["family"] == "exploratory" and new_contrast["added_by_extension"] == 1
    assert _contrast(first_report, "raw_token_weighted", 1.0)["n_pairs"] == 2
    assert {t.trial_id for t in client.trials(first)} == {
        r.data.tags["ksweep.trial_id"] for r in after}

    # A second sweep with R~ beside uniform on seeds 0-2, reusing the first's trials: its three
    # uniform trials are the first's runs; it trains R~ at alpha 1 only.
    second = client.submit(_spec("grow-second", alpha=[0, 1], seeds=3, reuse="own",
                                 loss_stacks=["uniform", {"name": "concentration_corrected",
                                                          "terms": {"concentration_corrected": 1.0}}]
                                 )).id
    _wait(client, second, lambda s: s.state == "running", what="the second sweep to start")
    # Extended while it runs: R_tok joins, and its trials too are the first sweep's.
    running = client.extend(second, loss_stacks=["raw_token_weighted"])
    assert running.extension.state_before == "running" and "after them" in running.when
    _ended(client, second, "the second sweep")
    _, trained = _runs(uri, second)
    _one_run_per_trial(trained, 3)  # R~ at alpha 1; nothing reused was copied
    assert {r.data.tags["ksweep.loss_stack"] for r in trained} == {"concentration_corrected"}
    report = client.report_json(second)
    reused = {r["mlflow_run_id"]: r for r in report["reused"]}
    assert len(reused) == 6 and {r["sweep_id"] for r in reused.values()} == {first}
    first_runs = {r.info.run_id: r for r in after}
    assert set(reused) <= set(first_runs)
    for run_id, entry in reused.items():
        assert entry["trial_hash"] == first_runs[run_id].data.tags[TRIAL_HASH_TAG]
    assert report["dedup"]["trials_reused"] == 6
    assert _cell(report, "raw_token_weighted", 1.0)["n"] == 3
    assert _contrast(report, "concentration_corrected", 1.0)["n_pairs"] == 3
    frames = client.frames(second)
    assert len(frames.trials) == 9
    assert (frames.trials["reused_from"] == first).sum() == 6
    reused_ids = set(frames.trials.loc[frames.trials["reused_from"] == first, "trial_id"])
    assert reused_ids <= set(frames.history["trial_id"])  # their curves, read in their own runs

    # The two compared: R~ (second) against uniform, R_tok (first) against uniform.
    compared = client.compare([first, second])
    assert [c["sweep_id"] for c in compared["compared"]] == [first, second]
    assert _contrast(compared, "concentration_corrected", 1.0)["n_pairs"] == 3
    assert _contrast(compared, "raw_token_weighted", 0.5)["n_pairs"] == 3
    joined = client.compare_frames([first, second])
    assert set(joined.trials["sweep_id"]) == {first, second}
    env = {**os.environ, "KSWEEP_URL": client.url, "KSWEEP_TOKEN": TOKENS["alice"],
           "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    shown = subprocess.run([sys.executable, "-m", "ksweep.cli", "report", first, second],
                           env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert max(len(line) for line in shown.stdout.splitlines()) <= 80
    assert f"{first} (grow-first): 9 trials" in shown.stdout
    client.close()

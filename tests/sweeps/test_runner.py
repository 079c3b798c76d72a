"""Real sweeps on local Ray with a temporary sqlite MLflow store."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from sweeps.status import read_status
from tests.support.mlflow_store import sqlite_store_uri
from workers.contract import RUN_KIND_SWEEP, RUN_KIND_TAG, RUN_KIND_TRIAL

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
pytestmark = pytest.mark.slow
# Fault tests that assert on steps, runs and states, not on what the model learns: a quarter of
# the quickstart's data, smaller val and test splits. Epochs then pass fast, so a kill timed off
# status.json (1 s behind Tune) needs a trial with epochs to spare (test_ray_faults.py).
SMALL_DATA = {"template.data.train_size": 256, "template.data.val_size": 128,
              "template.data.test_size": 128}


def _env(tmp_path: Path, fresh_store: bool = False) -> dict[str, str]:
    return {
        **os.environ,
        "MLFLOW_TRACKING_URI": (f"sqlite:///{tmp_path}/mlflow.db" if fresh_store
                                else sqlite_store_uri(tmp_path)),
        "KSWEEP_SWEEP_ROOT": str(tmp_path / "root"),
        "RAY_ADDRESS": "",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),  # this checkout's code, whatever the venv's install points at
    }


def _sweep(tmp_path: Path, spec: Path, sweep_id: str, fresh_store: bool = False,
           env: dict[str, str] | None = None, num_cpus: int = 2, **popen):
    """``ksweep sweep run`` on ``tmp_path``'s MLflow store (a migrated empty copy unless
    ``fresh_store``: then the driver creates it, as on a user's first run), with ``env`` on top
    of its environment (Ray's config overrides). ``num_cpus=1`` trains the same plan's trials one
    after another in one reused process: a test not about trials side by side saves the second
    process's imports."""
    return subprocess.Popen(
        [sys.executable, "-m", "ksweep.cli", "sweep", "run", str(spec), "--sweep-id", sweep_id,
         "--num-cpus", str(num_cpus)],
        env=_env(tmp_path, fresh_store) | (env or {}), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True, **popen,
    )


def _runs(tmp_path: Path, experiment: str, sweep_id: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`ksweep.sweep_id` = '{sweep_id}'")
    parents = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RUN_KIND_SWEEP]
    children = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RUN_KIND_TRIAL]
    return client, exp, parents, children


def _write_spec(tmp_path: Path, name: str, changes: dict) -> Path:
    spec = yaml.safe_load(QUICKSTART.read_text())
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.timeout(1800)  # 15 trials
def test_quickstart_sweep_end_to_end(tmp_path):
    # The quickstart's plan (27 rows, 15 trials in cohorts, on 2 CPUs) at 2 epochs on a quarter
    # of its data: nothing below depends on how far the trials learn (the shipped 8 epochs on
    # 1,024 examples take about 3 minutes alone: `make demo` runs them whole).
    epochs = 2
    spec = _write_spec(tmp_path, "quickstart", {**SMALL_DATA, "template.training.epochs": epochs})
    process = _sweep(tmp_path, spec, "qs1", fresh_store=True)  # as a first run
    output, _ = process.communicate(timeout=1700)
    assert process.returncode == 0, output
    client, exp, parents, children = _runs(tmp_path, "quickstart", "qs1")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    # 27 rows, 15 trials: per seed uniform once (it stands in 5 rows), R_tok and R~ at 1 and 2.
    assert len(parents) == 1 and len(children) == 15
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    grid = {(c.data.params["alpha"], c.data.params["loss_stack"]) for c in children}
    assert grid == {("0.0", "uniform")} | {
        (a, s) for a in ("1.0", "2.0") for s in ("raw_token_weighted", "concentration_corrected")}
    shared = [c for c in children if c.data.tags.get("ksweep.shared_by")]
    assert len(shared) == 3 and all(c.data.params["loss_stack"] == "uniform" for c in shared)
    assert "raw_token_weighted@alpha=0" in shared[0].data.tags["ksweep.shared_by"]
    for child in children:
        assert child.info.status == "FINISHED"
        assert float(child.data.params["c_base"]) > 0
        # The run's units: 2 epochs x ceil(256 / 64) steps; beta 1 (undivided) x the mean
        # target length of its train sample (prefix 2 + a body of 4-6 tokens).
        params = child.data.params
        length = float(params["train_target_length"])
        assert float(params["total_steps"]) == epochs * 4 and 6.8 < length < 7.2
        assert float(params["elbo_beta"]) == pytest.approx(length, rel=1e-12)
        history = client.get_metric_history(child.info.run_id, "val/latent_nmi")
        assert [m.step for m in history] == list(range(1, epochs + 1))
        # No per-trial PNGs unless tracking.trial_plots asks (members and lone trials alike).
        assert client.list_artifacts(child.info.run_id, "plots") == []
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.json", "report.md", "spec.json", "plots"} <= artifacts
    plots = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/contrasts.png", "plots/curves_per_alpha.png"} <= plots
    assert any(p.startswith("plots/latent_nmi_vs_alpha__discrete") for p in plots)
    report = json.loads((tmp_path / "root" / "qs1" / "report.json").read_text())
    assert report["dedup"] == {"trials_requested": 27, "trials_run": 15,
                               "trials_saved_by_dedup": 12, "trials_reused": 0}
    assert report["counts"] == {"done": 15}
    # Read at the epoch val chose (selected/*), reported on test; val's cells are beside them.
    assert (report["split"], report["readout_source"]) == ("test", "selected")
    nmi = [c for c in report["cells"] if c["metric"] == "latent_nmi" and c["kind"] == "all"
           and c["split"] == "test"]
    assert len(nmi) == 9 and all(c["n"] == 3 and len(c["values"]) == 3 for c in nmi)
    assert all(6.8 < c["beta_elbo"] < 7.2 for c in nmi)
    assert not any("did not finish" in line for line in report["limitations"])  # no schedule
    # alpha = 0 is exactly uniform weighting: kappa = 1 there, > 1 elsewhere (a shared trial
    # reports kappa at the alpha of the row that ran: uniform at alpha 0).
    for cell in (c for c in report["cells"] if c["metric"] == "kappa_mean"):
        ran_at_zero = cell["alpha"] == 0 or cell["shared_with"]
        assert (cell["mean"] == pytest.approx(1.0)) if ran_at_zero else cell["mean"] > 1.2
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    assert len(primary) == 4 and all(c["n_pairs"] == 3 for c in primary)
    assert all(c["p_adjusted"] is not None for c in primary)
    assert report["best"][0]["metric"] == "latent_nmi"
    # Power by design: one entry per primary contrast (no min_effect on NMI: no seeds needed);
    # the predictions recorded once, with the time, in the sweep's folder.
    assert len(report["power"]["entries"]) == 4 and report["power"]["level"] == pytest.approx(0.0125)
    recorded = json.loads((tmp_path / "root" / "qs1" / "predictions.json").read_text())
    assert report["predictions"]["submitted_at"] == recorded["submitted_at"] is not None
    assert any(k.startswith("best/") for k in parent.data.metrics)
    status = read_status(tmp_path / "root" / "qs1" / "status.json")
    assert (status.state, status.total, status.done, status.pending, status.running) == (
        "succeeded", 15, 15, 0, 0)
    assert parent.data.tags["ksweep.trials_done"] == "15"
    assert "Primary contrasts" in output


@pytest.fixture
def dead_ray_recorded():
    """A Ray temp folder (short: Ray's socket paths have a length limit) whose record of the
    last ``ray start`` names a Ray that is gone, as a head stopped by a signal leaves it."""
    folder = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    (folder / "ray").mkdir()
    (folder / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_optuna_asha_stops_some_trials_early_and_a_diverging_trial_fails_alone(tmp_path, dead_ray_recorded):
    # Optuna's trials are lone trials (suggested one by one, never packed in a cohort): an
    # exploding stack among the sampled ones diverges at step 0, fails with the reason, and
    # the others go on, some stopped early by ASHA. One sweep holds both cases. And another
    # Ray recorded on the machine: the sweep starts its own (ray.init would join the record).
    spec = _write_spec(tmp_path, "asha", {
        "alpha": {"low": 0.0, "high": 4.0},
        "loss_stacks": ["uniform", "raw_token_weighted",
                        {"name": "exploding", "terms": {"token_weighted": 1e38, "uniform": 1e38}}],
        "search": {"kind": "optuna", "sampler": "tpe", "seed": 0, "num_samples": 6},
        "scheduler": {"kind": "asha", "grace_period": 1, "reduction_factor": 2},
        **SMALL_DATA, "template.training.epochs": 4, "seeds": 1,
        "budget.max_failures_per_trial": 0,
    })
    process = _sweep(tmp_path, spec, "oa1", env={"RAY_TMPDIR": str(dead_ray_recorded)}, num_cpus=1)
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output  # the sweep succeeds: its other trials finished
    assert (dead_ray_recorded / "ray" / "ray_current_cluster").read_text() == "127.0.0.1:1"
    assert list((dead_ray_recorded / "ray").glob("session_*")), "its own Ray, in that folder"
    report = json.loads((tmp_path / "root" / "oa1" / "report.json").read_text())
    trials = report["trials"]
    assert len(trials) == 6
    alphas = {t["alpha"] for t in trials}
    assert len(alphas) == 6 and all(0.0 <= a <= 4.0 for a in alphas)
    exploding = [t for t in trials if t["loss_stack"] == "exploding"]
    assert 1 <= len(exploding) < 6
    for trial in exploding:
        assert trial["state"] == "failed"
        assert "TrialDiverged" in trial["error"] and "step 0" in trial["error"], trial["error"]
    epochs = [t["epochs"] for t in trials if t not in exploding]
    assert report["counts"].get("stopped", 0) >= 1 and min(epochs) < 4, epochs
    assert max(epochs) == 4
    _, _, _, children = _runs(tmp_path, "quickstart", "oa1")
    assert len(children) == 6
    failed = [c for c in children if c.data.params["loss_stack"] == "exploding"]
    assert len(failed) == len(exploding)
    for child in failed:
        assert child.info.status == "FAILED"
        assert "loss became inf at step 0" in child.data.tags["ksweep.failure"]
    assert all(c.info.status == "FINISHED" for c in children if c not in failed)
    stopped = [c for c in children if c.data.tags.get("ksweep.stopped_early") == "true"]
    assert len(stopped) == report["counts"]["stopped"]
    status = read_status(tmp_path / "root" / "oa1" / "status.json")
    assert (status.done, status.stopped, status.failed) == (
        6 - len(exploding) - len(stopped), len(stopped), len(exploding))

"""ksweep.Client against a real service, Ray and MLflow store: typed returns, errors carrying
the problem document's fields, DataFrames equal to the ones read from MLflow alone, and the
CLI commands built on the client (report tables, export, watch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pandas.testing as pdt
import pytest
import yaml

from ksweep import (
    Client,
    InvalidRequest,
    NotFound,
    Report,
    ReportNotReady,
    ServiceUnreachable,
    SpecError,
    Sweep,
    Trial,
    Unauthorized,
)
from ksweep.frames import from_mlflow
from tests.client.conftest import repo_root
from tests.service.conftest import tiny_spec
from tests.support.groups import client_service
from tests.support.serve_process import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(service_env):
    with Client(service_env["KSWEEP_URL"], service_env["KSWEEP_TOKEN"]) as c:
        yield c


def _ksweep(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env, "PYTHONPATH": str(repo_root()), "COLUMNS": "80",
            "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "ksweep.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120, cwd=repo_root())


@client_service
def test_submit_and_wait_return_typed_sweeps(ended_sweep, client):
    submitted, ended = ended_sweep["submitted"], ended_sweep["ended"]
    assert isinstance(submitted, Sweep) and submitted.state == "queued"
    assert submitted.counters.total == 3  # 4 rows, uniform shared across alpha
    assert isinstance(ended_sweep["early_report"], ReportNotReady)
    assert ended_sweep["early_report"].status == 409
    assert ended.state == "succeeded" and ended.counters.done == 3 and ended.progress == 1.0
    again = client.submit(tiny_spec("client", **{"template.training.epochs": 2}),
                          idempotency_key="client-tests")
    assert again.id == ended_sweep["id"]
    assert ended_sweep["id"] in {s.id for s in client.list(limit=500).items}


@client_service
def test_trials_and_report_are_models(ended_sweep, client):
    trials = client.trials(ended_sweep["id"])
    assert len(trials) == 3 and all(isinstance(t, Trial) and t.epochs == 2 for t in trials)
    report = client.report(ended_sweep["id"])
    assert isinstance(report, Report) and report.sweep_id == ended_sweep["id"]
    nmi = [c for c in report.cells if c.metric == "latent_nmi" and c.kind == "all"
           and c.split == report.split]
    assert len(nmi) == 4 and all(0.0 <= c.mean <= 1.0 for c in nmi)


@client_service
def test_wait_draws_a_bar_with_counts_and_eta(ended_sweep, client, capsys):
    client.wait(ended_sweep["id"], progress=True)
    err = capsys.readouterr().err
    assert "3/3" in err and "succeeded" in err and "ETA" in err


@client_service
def test_errors_carry_the_problem_fields(client, service_env, tmp_path):
    with pytest.raises(InvalidRequest) as invalid:
        client.submit(tiny_spec("bad", alpha=[-1, 1]))
    assert invalid.value.status == 422
    assert any(e.field.startswith("alpha") and "greater than or equal" in e.message
               for e in invalid.value.errors)
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text(yaml.safe_dump(tiny_spec("bad", seeds=0)))
    with pytest.raises(SpecError) as spec_error:
        client.submit(bad_file)
    assert [e.field.split(".")[0] for e in spec_error.value.errors] == ["seeds"]
    assert "bad.yaml" in str(spec_error.value)
    with pytest.raises(NotFound, match="no sweep with id 'nosuchsweep'"):
        client.get("nosuchsweep")
    with pytest.raises(Unauthorized):
        Client(service_env["KSWEEP_URL"], "wrong-token").cancel("nosuchsweep")
    with pytest.raises(ServiceUnreachable, match="cannot reach"):
        Client(f"http://127.0.0.1:{free_port()}").get("x")


@client_service
def test_history_refuses_unknown_metrics(ended_sweep, client):
    with pytest.raises(InvalidRequest) as error:
        client.history(ended_sweep["id"], ["val/latent_nmi", "val/no_such"])
    assert error.value.errors[0].field == "metrics"
    assert "val/no_such" in error.value.errors[0].message
    with pytest.raises(InvalidRequest, match="not a metric name"):
        client.history(ended_sweep["id"], ["val/latent nmi"])


@client_service
def test_frames_equal_the_ones_from_mlflow_alone(ended_sweep, client, tracking_uri):
    metrics = ["val/latent_nmi", "train/loss"]
    served = client.frames(ended_sweep["id"], metrics)
    direct = from_mlflow(tracking_uri, ended_sweep["id"], metrics)
    for table in ("trials", "cells", "contrasts", "history"):
        pdt.assert_frame_equal(getattr(served, table), getattr(direct, table), check_exact=True)
    trials = served.trials
    assert list(trials["trial_id"]) == sorted(trials["trial_id"]) and len(trials) == 3
    assert {"alpha", "loss_stack", "seed", "state", "selected_epoch", "shared_by",
            "mlflow_run_id", "test/latent_nmi", "selected/test/latent_nmi"} <= set(trials)
    assert (trials["epochs"] == 2).all() and trials["selected_epoch"].between(1, 2).all()
    # One uniform trial stands in both alphas' uniform rows.
    assert trials.loc[trials["loss_stack"] == "uniform", "shared_by"].str.contains(",").all()
    history = served.history
    assert len(history) == 3 * 2 * 2 and set(history["epoch"]) == {1, 2}
    assert set(history["metric"]) == set(metrics)
    last = history[(history["metric"] == "val/latent_nmi") & (history["epoch"] == 2)]
    merged = last.merge(trials, on="trial_id")
    # The curve's last point is the run's final value.
    assert (merged["value"] == merged["val/latent_nmi"]).all()
    cells = served.cells
    report = client.report(ended_sweep["id"])
    assert len(cells) == len(report.cells) and {"mean", "ci_low", "ci_high", "n"} <= set(cells)
    assert len(served.contrasts) == len(report.contrasts)


@client_service
def test_from_mlflow_by_experiment_and_clear_errors(ended_sweep, tracking_uri):
    by_name = from_mlflow(tracking_uri, "client")  # the experiment is named after the spec
    assert set(by_name.trials["trial_id"]) == set(from_mlflow(tracking_uri, ended_sweep["id"])
                                                 .trials["trial_id"])
    with pytest.raises(LookupError, match="neither a sweep id nor an experiment"):
        from_mlflow(tracking_uri, "no-such-sweep")


@client_service
def test_export_writes_every_format(ended_sweep, client, service_env, tmp_path):
    sweep_id = ended_sweep["id"]
    cells = client.frame(sweep_id, "cells")
    out = tmp_path / "cells.parquet"
    done = _ksweep(service_env, "export", sweep_id, "--format", "parquet", "--table", "cells",
                   "-o", str(out))
    assert done.returncode == 0, done.stderr
    pdt.assert_frame_equal(pd.read_parquet(out), cells, check_dtype=False)
    csv = _ksweep(service_env, "export", sweep_id, "--table", "history", "--format", "csv",
                  "--metrics", "val/latent_nmi")
    assert csv.returncode == 0, csv.stderr
    assert csv.stdout.splitlines()[0].endswith("epoch,metric,value")
    assert len(csv.stdout.strip().splitlines()) == 1 + 3 * 2
    records = _ksweep(service_env, "export", sweep_id, "--table", "trials", "--format", "json")
    assert [r["trial_id"] for r in json.loads(records.stdout)] == sorted(
        t.trial_id for t in client.trials(sweep_id))
    refused = _ksweep(service_env, "export", sweep_id, "--table", "history", "--metrics", "x/y")
    assert refused.returncode == 2 and "metrics" in refused.stdout


@client_service
def test_report_renders_tables_within_the_terminal(ended_sweep, service_env):
    sweep_id = ended_sweep["id"]
    shown = _ksweep(service_env, "report", sweep_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any("latent_nmi by alpha" in line for line in lines)
    # Rich tables wrap inside their columns: no line is wider than the terminal.
    assert max(len(line) for line in lines if not line.startswith("MLflow:")) <= 80
    raw = _ksweep(service_env, "report", sweep_id, "--format", "md")
    assert raw.stdout.startswith("# Sweep client") and "| model |" in raw.stdout
    as_json = _ksweep(service_env, "report", sweep_id, "--format", "json")
    assert json.loads(as_json.stdout)["sweep_id"] == sweep_id
    missing = _ksweep(service_env, "report", "nosuchsweep")
    assert missing.returncode == 2 and "Sweep not found" in missing.stdout


@client_service
def test_watch_ends_with_one_line(ended_sweep, service_env):
    watched = _ksweep(service_env, "watch", ended_sweep["id"])
    assert watched.returncode == 0, watched.stdout + watched.stderr
    lines = [line.strip() for line in watched.stdout.splitlines() if line.strip()]
    assert lines[-1] == f"sweep {ended_sweep['id']} succeeded: 3/3 trials ended (3 done, " \
                        "0 stopped, 0 failed)"
    assert not any(line.startswith("of ") for line in lines)
    bar = lines[-2]  # the bar's last frame, whole within 80 columns (elapsed time at its end)
    assert len(bar) <= 80 and bar.startswith("client") and "3/3 succeeded latent_nmi" in bar
    assert "ETA 0s" in bar and bar.rstrip()[-7:].count(":") == 2


@client_service
def test_from_mlflow_reads_a_sweep_run_without_the_service(ended_sweep, tracking_uri):
    # The session sweep's MLflow store read with no service in the way (what from_mlflow reads
    # is what any driver logs: the service's, or ``ksweep sweep run``'s).
    frames = from_mlflow(tracking_uri, ended_sweep["id"])
    assert list(frames.trials["state"]) == ["done"] * 3
    assert frames.trials["mlflow_run_id"].notna().all()
    # The default curves (the report's five: NMI, ARI, loss, KL, kappa) at epochs 1 and 2.
    assert len(frames.history) == 3 * 2 * 5
    nmi = frames.cells.query("metric == 'latent_nmi' and kind == 'all' and split == 'test'")
    assert len(nmi) == 4 and nmi["mean"].between(0, 1).all()
    by_experiment = from_mlflow(tracking_uri, "client")  # the experiment is named after the spec
    pdt.assert_frame_equal(by_experiment.cells, frames.cells)

"""examples/dataset end to end with real parts: write the table, ``ksweep data add`` to a
real server, ``ksweep sweep run`` (a 2-seed, 2-epoch cohort sweep on local Ray, sqlite
MLflow) reading the same store, and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.service.conftest import ROOT
from tests.service.test_data_cli import ksweep
from tests.support.mlflow_store import sqlite_store_uri
from workers.contract import RUN_KIND_TAG, RUN_KIND_TRIAL

EXAMPLE = ROOT / "examples" / "dataset"
pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_example_registers_sweeps_in_a_cohort_and_reports(make_service, tmp_path: Path) -> None:
    service = make_service()
    source = tmp_path / "stories.parquet"
    subprocess.run([sys.executable, str(EXAMPLE / "make_dataset.py"), str(source), "--rows", "300"],
                   check=True, timeout=120)
    added = ksweep(service, "data", "add", str(source), "--name", "stories", "--json")
    assert added.returncode == 0, added.stdout + added.stderr
    record = json.loads(added.stdout)
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["resources"]["cohort_size"] = 2  # the two seeds of a stack train as one cohort
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "MLFLOW_TRACKING_URI": sqlite_store_uri(tmp_path),
           "KSWEEP_SWEEP_ROOT": service.env["KSWEEP_SWEEP_ROOT"], "RAY_ADDRESS": "",
           "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "ksweep.cli", "sweep", "run", str(path), "--sweep-id", "ds1",
         "--num-cpus", "1"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "Absent:" in done.stdout and record["sha256"] in done.stdout  # the printed report
    report = json.loads((Path(env["KSWEEP_SWEEP_ROOT"]) / "ds1" / "report.json").read_text())
    assert report["counts"] == {"done": 4}
    assert report["data"]["sha256"] == record["sha256"] and report["data"]["absent"]
    cells = {(c["loss_stack"], c["kind"], c["metric"], c["split"]): c for c in report["cells"]}
    for stack in ("uniform", "raw_token_weighted"):
        nmi = cells[(stack, "all", "latent_nmi", "test")]
        assert len(nmi["values"]) == 2 and all(0 <= v <= 1 for v in nmi["values"])
        assert 0 < cells[(stack, "all", "loss", "test")]["mean"] < 50
        assert (stack, "long", "latent_nmi", "test") in cells  # per-group read-outs
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("dataset-stories").experiment_id],
                              filter_string=f"tags.`{RUN_KIND_TAG}` = '{RUN_KIND_TRIAL}'")
    assert len(runs) == 4 and all(r.data.tags.get("ksweep.cohort") for r in runs)
    for run in runs:
        (entry,) = run.inputs.dataset_inputs
        assert entry.dataset.digest == record["sha256"][:32]
        assert run.data.params["dataset_sha256"] == record["sha256"]
        assert run.data.metrics["test/elbo"] > run.data.metrics["test/recon_uniform"] > 0

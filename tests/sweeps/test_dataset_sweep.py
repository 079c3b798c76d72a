"""Sweeps on a registered dataset: resolution and refusals, and the example end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from mlflow.tracking import MlflowClient

from sweeps.spec import SweepSpec
from sweeps.spec.datasets import resolve_spec_data
from tests.support.datasets import register, strategy_table
from workers.contract import RUN_KIND_TAG, RUN_KIND_TRIAL, TEST_ELBO
from workers.data.dataset_resolve import DatasetResolutionError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "dataset"


def _spec(**changes) -> SweepSpec:
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec.pop("objective")
    spec["analysis"] = {}
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return SweepSpec.model_validate(spec)


@pytest.fixture
def store(tmp_path):
    register(tmp_path, strategy_table(80), "stories")
    register(tmp_path, strategy_table(80, label=False), "unlabelled")
    return tmp_path


def test_a_labelled_dataset_resolves_to_its_hash_and_keeps_the_spec(store):
    spec = resolve_spec_data(_spec(), store)
    data = spec.template.data
    assert len(data.sha256) == 64 and data.root == str(store.resolve())
    assert spec.primary_metric == "val/latent_nmi" and spec.analysis.metric == "latent_nmi"


def test_a_label_less_dataset_defaults_to_test_elbo_and_refuses_label_metrics(store):
    spec = resolve_spec_data(_spec(**{"template.data.dataset": "unlabelled"}), store)
    assert spec.primary_metric == TEST_ELBO and spec.primary_mode == "min"
    assert spec.analysis.metric == "elbo" and "latent_nmi" not in spec.analysis.metrics
    refused = {
        "objective.metrics": {"objective.metrics": ["val/latent_ari"]},
        "analysis.metric": {"analysis.metric": "mi_zs"},
        "analysis.metrics": {"analysis.metrics": ["elbo", "latent_ari"]},
    }
    for field, changes in refused.items():
        with pytest.raises(DatasetResolutionError) as error:
            resolve_spec_data(_spec(**{"template.data.dataset": "unlabelled", **changes}), store)
        assert error.value.field == field and "needs a label" in str(error.value)


def test_what_a_dataset_cannot_give_is_refused_by_name(store):
    cases = {
        "template.base.kind": ({"template.base.kind": "oracle"}, "'oracle'"),
        "analysis.primary": ({"analysis.primary": "caveat", "analysis.caveat_treated": "uniform",
                              "analysis.caveat_control": "raw_token_weighted"},
                             "prefix and private"),
        "template.data.dataset": ({"template.data.dataset": "absent"}, "no dataset named"),
    }
    for field, (changes, words) in cases.items():
        with pytest.raises(DatasetResolutionError) as error:
            resolve_spec_data(_spec(**changes), store)
        assert error.value.field == field and words in str(error.value)
    with pytest.raises(DatasetResolutionError, match="base_nll column"):
        resolve_spec_data(_spec(**{"template.base.kind": "precomputed"}), store)


def test_a_resumed_sweep_keeps_the_hash_it_started_with(store, tmp_path):
    first = resolve_spec_data(_spec(), store)
    previous = tmp_path / "spec.json"
    previous.write_text(first.canonical_json())
    register(store, strategy_table(80, seed=5), "stories", replace=True)
    with pytest.raises(DatasetResolutionError, match="template.data.sha256"):
        resolve_spec_data(_spec(), store, previous)  # the name moved on: refused, not mixed
    assert resolve_spec_data(_spec(), store).template.data.sha256 != first.template.data.sha256


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_example_registers_sweeps_in_a_cohort_and_reports(tmp_path):
    """examples/dataset end to end: write, register, a 2-seed 2-epoch cohort sweep, report."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "KSWEEP_SWEEP_ROOT": str(tmp_path / "root"), "RAY_ADDRESS": "",
           "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    source = tmp_path / "stories.parquet"
    subprocess.run([sys.executable, str(EXAMPLE / "make_dataset.py"), str(source), "--rows", "300"],
                   check=True, env=env, timeout=120)
    record = register(tmp_path / "root" / "datasets", pq.read_table(source), "stories")
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["resources"]["cohort_size"] = 2  # the two seeds of a stack train as one cohort
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "sweep", "run", str(path), "--sweep-id", "ds1",
         "--num-cpus", "2"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "root" / "ds1" / "report.json").read_text())
    assert report["counts"] == {"done": 4}
    assert report["data"]["sha256"] == record.sha256 and report["data"]["absent"]
    cells = {(c["loss_stack"], c["kind"], c["metric"], c["split"]): c for c in report["cells"]}
    for stack in ("uniform", "raw_token_weighted"):
        nmi = cells[(stack, "all", "latent_nmi", "test")]
        assert len(nmi["values"]) == 2 and all(0 <= v <= 1 for v in nmi["values"])
        assert 0 < cells[(stack, "all", "loss", "test")]["mean"] < 50
        assert (stack, "long", "latent_nmi", "test") in cells  # per-group read-outs
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("dataset-stories").experiment_id],
                              filter_string=f"tags.`{RUN_KIND_TAG}` = '{RUN_KIND_TRIAL}'")
    assert len(runs) == 4 and all(r.data.tags.get("ksweep.cohort") for r in runs)
    for run in runs:
        (entry,) = run.inputs.dataset_inputs
        assert entry.dataset.digest == record.sha256[:32]
        assert run.data.params["dataset_sha256"] == record.sha256
        assert run.data.metrics["test/elbo"] > run.data.metrics["test/recon_uniform"] > 0

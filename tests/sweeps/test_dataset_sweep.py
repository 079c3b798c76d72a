"""Sweeps on a registered dataset: resolution and refusals (the example end to end is
tests/service/test_dataset_example.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweeps.spec import SweepSpec
from sweeps.spec.datasets import resolve_spec_data
from tests.support.datasets import register, strategy_table
from workers.contract import TEST_ELBO
from workers.datasets.resolve import DatasetResolutionError

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
    # On a dataset the default primary metric is chance-corrected: AMI, NMI and its shuffled-label
    # chance level beside it in the cells.
    assert spec.primary_metric == "val/latent_ami" and spec.primary_mode == "max"
    assert spec.analysis.metric == "latent_ami"
    assert {"latent_nmi", "latent_nmi_shuffled", "mutual_info"} <= set(spec.analysis.metrics)


def test_a_label_less_dataset_defaults_to_test_elbo_and_refuses_label_metrics(store):
    spec = resolve_spec_data(_spec(**{"template.data.dataset": "unlabelled"}), store)
    assert spec.primary_metric == TEST_ELBO and spec.primary_mode == "min"
    assert spec.analysis.metric == "elbo" and "latent_nmi" not in spec.analysis.metrics
    named_nmi = resolve_spec_data(_spec(**{"template.data.dataset": "unlabelled",
                                           "analysis.metric": "latent_nmi"}), store)
    assert named_nmi.analysis.metric == "elbo" and named_nmi.primary_metric == TEST_ELBO
    assert "mutual_info" in spec.analysis.metrics and "latent_ami" not in spec.analysis.metrics
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


def test_a_learned_prior_on_a_dataset_without_context_is_flagged(tmp_path):
    """x empty on every row and model.prior learned: the report says the KL reads about 0 there
    and to read I(x; z); a standard prior, or a dataset with context, gets no such words."""
    from sweeps.report.build import build_report

    table = strategy_table(80)
    register(tmp_path, table.drop(["x"]), "no_context")  # a missing x column: empty contexts
    register(tmp_path, table, "with_context")
    words = "has no context (x is empty on every row)"

    def limits(dataset: str, prior: str) -> list[str]:
        spec = resolve_spec_data(_spec(**{"template.data.dataset": dataset,
                                          "template.model.prior": prior}), tmp_path)
        return build_report(spec, "p", [])["limitations"]

    assert any(words in line and "'no_context'" in line for line in limits("no_context", "learned"))
    assert not any(words in line for line in limits("no_context", "standard"))
    assert not any(words in line for line in limits("with_context", "learned"))

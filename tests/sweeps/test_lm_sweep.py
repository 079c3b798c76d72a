"""A sweep spec with ``base: {kind: causal_lm, model: NAME}``: resolved once, refusals named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sweeps.spec import SweepSpec
from sweeps.spec.datasets import resolve_spec_data
from tests.support.tiny_lm import build_tiny_llama, text_table
from workers.datasets.resolve import DatasetResolutionError
from workers.datasets.store import DatasetStore
from workers.datasets.table import canonicalize, tokenizer_of
from workers.lm.loading import fingerprint_files
from workers.lm.registry import ModelStore
from workers.lm.tokenizer import ModelTextTokenizer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dataset" / "spec.yaml"


def _spec(dataset: str | None, base: dict) -> SweepSpec:
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec.pop("objective")
    spec["analysis"] = {}
    if dataset is None:
        spec["template"].pop("data")
    else:
        spec["template"]["data"] = {"dataset": dataset}
    spec["template"]["base"] = base
    return SweepSpec.model_validate(spec)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm-sweep")
    models = ModelStore(tmp / "models")
    record = models.add(build_tiny_llama(tmp / "tiny"), name="tiny", fingerprint=fingerprint_files)
    datasets = DatasetStore(tmp / "datasets")
    good = canonicalize(text_table(40), "t.parquet", tokenizer=ModelTextTokenizer.of(models, record))
    datasets.add(good, name="words", owner="t", tokenizer=tokenizer_of(good))
    other = canonicalize(text_table(40), "t.parquet")
    datasets.add(other, name="bytes", owner="t", tokenizer=tokenizer_of(other))
    return tmp, record


def test_causal_lm_resolves_to_the_model_hash_and_a_resume_keeps_it(roots, tmp_path):
    tmp, record = roots
    base = {"kind": "causal_lm", "model": "tiny"}
    spec = resolve_spec_data(_spec("words", base), tmp / "datasets", model_root=tmp / "models")
    assert spec.template.base.model_sha256 == record.sha256
    assert spec.template.base.model_root == str(tmp / "models")
    # A resumed sweep reads the hash its first attempt stored, even after the name moved.
    previous = tmp_path / "spec.json"
    first = spec.model_dump(mode="json")
    first["template"]["base"]["model_sha256"] = "a" * 64
    previous.write_text(json.dumps(first))
    with pytest.raises(DatasetResolutionError, match="model_sha256: pinned a+ but model 'tiny'"):
        resolve_spec_data(_spec("words", base), tmp / "datasets", previous,
                          model_root=tmp / "models")


def test_causal_lm_refusals_name_the_field(roots):
    tmp, _ = roots
    base = {"kind": "causal_lm", "model": "tiny"}
    with pytest.raises(DatasetResolutionError) as error:
        resolve_spec_data(_spec("bytes", base), tmp / "datasets", model_root=tmp / "models")
    assert error.value.field == "template.base.model" and "'bytes'" in str(error.value)
    with pytest.raises(DatasetResolutionError) as error:
        resolve_spec_data(_spec(None, base), tmp / "datasets", model_root=tmp / "models")
    assert error.value.field == "template.base.kind" and "synthetic" in str(error.value)
    with pytest.raises(DatasetResolutionError, match="set KSWEEP_MODEL_ROOT"):
        resolve_spec_data(_spec("words", base), tmp / "datasets", model_root=None)

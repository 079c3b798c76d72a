"""A trial's identity: the objective key within a sweep, the content hash across sweeps."""

import dataclasses

import pytest

from sweeps import SweepSpec, build_plan
from sweeps.plan.identity import (
    code_digest,
    hashed_content,
    objective_key,
    training_code_files,
    training_environment,
    trial_hash,
)
from sweeps.spec import load_sweep_spec
from tests.service.conftest import QUICKSTART

ROW = {"alpha": 1.0, "loss_stack": "raw_token_weighted", "model": "discrete", "seed": 0}


@pytest.fixture(scope="module")
def quickstart() -> SweepSpec:
    return load_sweep_spec(QUICKSTART)


def _changed(spec: SweepSpec, dotted: str, value) -> SweepSpec:
    data = spec.model_dump(mode="json")
    node = data
    *parents, last = dotted.split(".")
    for key in parents:
        node = node[key]
    node[last] = value
    return SweepSpec.model_validate(data)


def test_every_trial_of_a_plan_has_its_own_hash_and_rows_it_stands_in_share_it(quickstart):
    env = training_environment(quickstart)
    plan = build_plan(quickstart)
    hashes = [trial_hash(quickstart, trial, env) for trial in plan.trials]
    assert len(set(hashes)) == len(hashes) == 15 and all(len(h) == 64 for h in hashes)
    # uniform is one objective at every alpha, raw token weighting at alpha 0 is uniform:
    # every such row hashes (and keys) as the trial that stands in it.
    uniform = {**ROW, "loss_stack": "uniform", "alpha": 0.0}
    for row in ({**uniform, "alpha": 2.0}, {**uniform, "alpha": 0.5},
                {**ROW, "alpha": 0.0}, {**ROW, "loss_stack": "concentration_corrected", "alpha": 0.0}):
        assert trial_hash(quickstart, row, env) == trial_hash(quickstart, uniform, env)
        assert objective_key(quickstart, row) == objective_key(quickstart, uniform)
    # Params read back from run tags are text: the same key and hash.
    text = {"alpha": "1.0", "loss_stack": "raw_token_weighted", "model": "discrete", "seed": "0",
            "beta": "None", "free_bits": ""}
    assert trial_hash(quickstart, text, env) == trial_hash(quickstart, ROW, env)


def test_the_hash_changes_with_everything_that_determines_a_result(quickstart):
    env = training_environment(quickstart)
    base = trial_hash(quickstart, ROW, env)
    assert trial_hash(quickstart, {**ROW, "seed": 1}, env) != base
    assert trial_hash(quickstart, {**ROW, "alpha": 2.0}, env) != base
    both = _changed(quickstart, "models", ["discrete", "continuous"])
    assert trial_hash(both, {**ROW, "model": "continuous"}, env) != base
    assert trial_hash(both, ROW, env) == base  # another model swept beside it changes nothing
    for dotted, value in (("template.training.epochs", 9), ("template.data.train_size", 512),
                          ("template.training.learning_rate", 0.001),
                          ("template.readouts.test", False), ("common_terms.kl.weight", 0.5)):
        assert trial_hash(_changed(quickstart, dotted, value), ROW, env) != base, dotted
    for field, value in (("torch_version", "2.99.0"), ("device_type", "cuda"),
                         ("precision", "bf16"), ("code_digest", "0" * 64), ("compat_version", 99)):
        assert trial_hash(quickstart, ROW, dataclasses.replace(env, **{field: value})) != base
    # What does not change a trial: the sweep's name, tags, budget, the stack's label.
    for dotted, value in (("name", "other"), ("tags", {"x": "y"}), ("budget.max_trials", 50),
                          ("reuse", "own")):
        assert trial_hash(_changed(quickstart, dotted, value), ROW, env) == base, dotted


def test_the_hash_covers_the_resolved_objective_units_and_remedies(quickstart):
    """The KL options (its units, the mutual-information credit), the encoder and the collapse
    remedies each change a trial's result, so each changes its hash; what the report declares
    about contrasts (primary, predicted sign) trains nothing and changes none."""
    env = training_environment(quickstart)
    base = trial_hash(quickstart, ROW, env)
    for dotted, value in (("common_terms.kl.options.weight_units", "effective"),
                          ("common_terms.kl.options.mutual_info_credit", 1.0),
                          ("common_terms.kl.options.scale", "token"),
                          ("template.model.target_encoder", "bidirectional"),
                          ("template.model.word_dropout", 0.25),
                          ("template.model.prior", "standard"),
                          ("template.training.autoencoder_epochs", 2),
                          ("template.training.aggressive_epochs", 1),
                          ("template.readouts.train_subset", 128)):
        changed = _changed(quickstart, dotted, value)
        assert trial_hash(changed, ROW, env) != base, dotted
    effective = _changed(quickstart, "common_terms.kl.options.weight_units", "effective")
    assert hashed_content(effective, ROW, env)["objective"] != hashed_content(
        quickstart, ROW, env)["objective"]  # the units are part of the objective itself
    declared = _changed(quickstart, "analysis.contrasts", [
        {"stack": "raw_token_weighted", "baseline": "uniform", "predicted": "lower"},
        {"stack": "concentration_corrected", "baseline": "uniform", "primary": False}])
    assert trial_hash(declared, ROW, env) == base


def test_the_code_digest_reads_everything_a_trial_runs_but_its_logging():
    files = training_code_files()
    # The optimizer, models, read-outs and data live outside the trainers' folders: all are read.
    for needed in ("objectives/terms.py", "workers/adamw.py", "workers/models/cvae.py",
                   "workers/readouts/evaluate.py", "workers/cohort/trainer.py",
                   "workers/train/loop.py", "workers/data/synthetic.py"):
        assert needed in files, needed
    assert not [name for name in files if name.startswith("workers/tracking/")]
    assert list(files) == sorted(files) and len(code_digest()) == 64


def test_the_environment_is_read_without_torch_and_follows_the_resources(quickstart):
    env = training_environment(quickstart)
    assert env.device_type == "cpu" and env.precision == "float32" and env.compat_version >= 1
    assert env.torch_version.split(".")[0].isdigit() and env.code_digest == code_digest()
    gpu = _changed(_changed(quickstart, "resources.gpu", 1), "template.training.bf16", True)
    assert (training_environment(gpu).device_type, training_environment(gpu).precision) == (
        "cuda", "bf16")
    content = hashed_content(quickstart, ROW, env)
    assert content["environment"]["code_digest"] == env.code_digest
    assert "name" not in content["config"] and "loss_stack" not in content["config"]


def test_a_dataset_trial_hashes_its_data_and_split_assignment():
    spec = SweepSpec.model_validate({
        "name": "ds", "alpha": [0, 1], "loss_stacks": ["uniform", "raw_token_weighted"],
        "template": {"data": {"dataset": "dialogues", "sha256": "a" * 64, "root": "/x"},
                     "base": {"kind": "learned"}}})
    env = training_environment(spec)
    content = hashed_content(spec, ROW, env)
    assert content["config"]["data"]["sha256"] == "a" * 64 and "root" not in content["config"]["data"]
    split = content["config"]["data"]["split_assignment_sha256"]
    assert len(split) == 64
    moved = _changed(spec, "template.data.root", "/elsewhere")
    assert trial_hash(moved, ROW, env) == trial_hash(spec, ROW, env)  # a store's path is no content
    for dotted, value in (("template.data.sha256", "b" * 64), ("template.data.split_seed", 7),
                          ("template.data.truncation", "head")):
        assert trial_hash(_changed(spec, dotted, value), ROW, env) != trial_hash(spec, ROW, env)
    assert hashed_content(_changed(spec, "template.data.split_seed", 7), ROW, env)["config"][
        "data"]["split_assignment_sha256"] != split

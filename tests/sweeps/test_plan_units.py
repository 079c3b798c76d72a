"""The plan's units and budgets: each trial's optimizer steps, its beta in ELBO units, the
schedules that do not finish within its run, and the train split they are read from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sweeps.plan.build import build_plan
from sweeps.spec import SweepSpec
from tests.support.datasets import register, strategy_table
from workers.data.config import DatasetDataConfig
from workers.datasets.source import build_task
from workers.datasets.store import DatasetStore
from workers.datasets.train_facts import dataset_facts, train_facts

ROOT = Path(__file__).resolve().parents[2]


def short_spec(kl_options: dict, **changes) -> SweepSpec:
    """3 epochs of 577 rows at batch 32 = 57 optimizer steps per trial; mean length 2 + 8 = 10."""
    spec = {"name": "short", "alpha": [0, 1], "loss_stacks": ["uniform", "ncc", "raw_plus_ncc"],
            "seeds": 1, "common_terms": {"kl": {"weight": 0.5, "options": kl_options}},
            "template": {"data": {"train_size": 577, "val_size": 64, "test_size": 64},
                         "model": {"discrete_estimator": "gumbel"},
                         "training": {"epochs": 3, "batch_size": 32}}}
    spec.update(changes)
    return SweepSpec.model_validate(spec)


def test_a_57_step_trial_with_the_default_schedules_is_listed():
    plan = build_plan(short_spec({"anneal": "linear"}))
    assert {t["total_steps"] for t in plan.trials} == {57}
    assert all(t["schedule_overruns"] == ["KL warm-up of 1000 steps",
                                          "Gumbel temperature decay of 2000 steps"] for t in plan.trials)
    assert len(plan.warnings) == 1
    assert plan.warnings[0].startswith(f"{plan.trial_count} trial(s) (1, 2, 3")
    assert "run 57 optimizer steps" in plan.warnings[0]
    assert plan.train == {"rows": 577, "mean_target_length": 10.0, "source": plan.train["source"]}


def test_schedules_given_relative_to_the_run_finish_and_are_not_listed():
    spec = short_spec({"anneal": "linear", "warmup_fraction": 0.5})
    spec = spec.model_copy(update={"template": spec.template.model_copy(update={
        "model": spec.template.model.model_copy(update={"gumbel_anneal_fraction": 0.8})})})
    plan = build_plan(SweepSpec.model_validate(spec.model_dump(mode="json")))
    assert plan.warnings == [] and all(t["schedule_overruns"] == [] for t in plan.trials)


def test_beta_in_elbo_units_per_stack_and_scale():
    by_stack = {(t["loss_stack"], t["alpha"]): t["elbo_beta"] for t in build_plan(short_spec({})).trials}
    assert by_stack[("uniform", 0.0)] == "5"  # 0.5 x mean length 10
    assert by_stack[("ncc", 1.0)] == "5 x c_base"
    assert by_stack[("raw_plus_ncc", 1.0)].startswith("unknown (needs c_base")
    per_token = {(t["loss_stack"], t["alpha"]): t["elbo_beta"]
                 for t in build_plan(short_spec({"scale": "token"})).trials}
    assert per_token[("uniform", 0.0)] == "0.5" and per_token[("ncc", 1.0)] == "0.5 x c_base"


def test_the_kl_scale_separates_trials_and_keeps_the_alpha_zero_twins():
    spec = SweepSpec.model_validate({
        "name": "scales", "alpha": [0, 1], "seeds": 1,
        "loss_stacks": ["uniform", "raw_token_weighted",
                        {"name": "uniform_per_token", "preset": "uniform",
                         "terms": {"kl": {"options": {"scale": "token"}}}},
                        {"name": "raw_per_token", "preset": "raw_token_weighted",
                         "terms": {"kl": {"options": {"scale": "token"}}}}]})
    plan = build_plan(spec)
    # Per scale: uniform is one trial at both alphas and raw_token_weighted at alpha 0 joins it;
    # raw at alpha 1 is its own. Never across scales: 2 x (1 + 1) = 4 trials of 8 rows.
    assert plan.trials_requested == 8 and plan.trial_count == 4
    shared = sorted(sorted(t["shared_by"]) for t in plan.trials if t["shared_by"])
    assert shared == [["raw_per_token@alpha=0", "uniform_per_token@alpha=0", "uniform_per_token@alpha=1"],
                      ["raw_token_weighted@alpha=0", "uniform@alpha=0", "uniform@alpha=1"]]


def _dataset(tmp_path: Path, split: bool) -> tuple[Path, DatasetDataConfig]:
    root = tmp_path / "datasets"
    table = strategy_table(rows=203, split=split, max_len=11)
    register(root, table, "lengths")
    return root, DatasetDataConfig(dataset="lengths")


@pytest.mark.parametrize("split", [True, False])
def test_a_datasets_mean_length_is_the_train_split_the_trainer_builds(tmp_path, split):
    root, config = _dataset(tmp_path, split)
    facts = dataset_facts(config, root)
    record = DatasetStore(root).get("lengths")
    resolved = config.model_copy(update={"sha256": record.sha256, "root": str(root)})
    task = build_task(DatasetStore(root).open_table(record.sha256), resolved)
    mask = task.splits["train"].mask
    assert len(set(mask.sum(-1).tolist())) > 3  # ragged targets
    assert facts.rows == mask.shape[0]
    assert facts.mean_target_length == pytest.approx(float(mask.sum(-1).double().mean()), rel=1e-12)
    # Where only the table holds the train split's lengths, a reader that may not read it says so.
    summary_only = dataset_facts(config, root, read_table=False)
    if split:
        assert summary_only == facts
    else:
        assert summary_only.rows == facts.rows and summary_only.mean_target_length is None
        assert "read when the trial runs" in summary_only.source


def test_truncation_and_a_missing_dataset_are_said_not_guessed(tmp_path):
    root, config = _dataset(tmp_path, split=True)
    cut = config.model_copy(update={"max_target_length": 5, "truncation": "head"})
    read = dataset_facts(cut, root)
    y = DatasetStore(root).open_table(DatasetStore(root).get("lengths").sha256)
    lengths = torch.tensor([min(len(v), 5) for v, s in zip(y.column("y").to_pylist(),
                                                            y.column("split").to_pylist(), strict=True)
                            if s == "train"], dtype=torch.float64)
    assert read.mean_target_length == pytest.approx(float(lengths.mean()), rel=1e-12)
    assert dataset_facts(cut, root, read_table=False).mean_target_length is None
    missing = train_facts(DatasetDataConfig(dataset="absent"), root)
    assert (missing.rows, missing.mean_target_length) == (None, None)
    assert "not registered" in missing.source
    spec = SweepSpec.model_validate({"name": "d", "alpha": [1], "loss_stacks": ["uniform"],
                                     "template": {"data": {"dataset": "absent"}, "base": {"kind": "learned"}}})
    plan = build_plan(spec)
    assert plan.trials[0]["total_steps"] is None
    assert plan.trials[0]["elbo_beta"] == "unknown (dataset 'absent' is not read here (no dataset store given))"


def _ksweep(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ksweep.cli", *args], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}, cwd=ROOT, timeout=120)


@pytest.mark.slow
def test_ksweep_validate_prints_steps_elbo_beta_and_warns(tmp_path):
    root, _ = _dataset(tmp_path, split=True)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: lengths\nalpha: [1]\nloss_stacks: [uniform]\nseeds: 1\n"
        "common_terms: {kl: {weight: 0.5, options: {anneal: linear}}}\n"
        "template: {data: {dataset: lengths}, base: {kind: learned},\n"
        "           training: {epochs: 3, batch_size: 32}}\n")
    record = DatasetStore(root).get("lengths")
    rows = record.summary["rows_per_split"]["train"]
    mean = record.summary["tokens"]["train"]["y"] / rows
    steps = 3 * -(-rows // 32)
    result = _ksweep("validate", str(spec), env={**os.environ, "KSWEEP_DATA_ROOT": str(root)})
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert f"train split: {rows} rows, mean target length {mean:.4g}" in out
    assert f"| {steps} ! |" in out.replace("│", "|") and f"{0.5 * mean:.3g}" in out
    assert (f"warning: 1 trial(s) (1) run {steps} optimizer steps, within which a schedule does not "
            "finish: KL warm-up of 1000 steps") in out
    as_json = _ksweep("validate", "--json", str(spec), env={**os.environ, "KSWEEP_DATA_ROOT": str(root)})
    assert f'"total_steps": {steps}' in as_json.stdout


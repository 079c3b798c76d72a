"""The CLI's spec files: YAML 1.2 numbers, strict validation, and bounded size and expansion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.spec import SweepSpec
from workers.yaml_loader import SpecFileError, load_yaml, read_spec_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "sweeps" / "examples").glob("*.yaml"))


def _ksweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ksweep.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT),
                                                                 "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("text, value", [
    ("3e-4", 3e-4), ("1e3", 1000.0), ("1.5E+2", 150.0), ("-2e-1", -0.2), (".5", 0.5),
    ("10", 10), ("0o17", 15), ("1:30", "1:30"), ("on", "on"), ("no", "no"), ("true", True),
])
def test_numbers_and_words_read_as_yaml_1_2(text, value):
    loaded = load_yaml(f"x: {text}\n")["x"]
    assert loaded == value and type(loaded) is type(value)


def test_scientific_learning_rates_pass_strict_validation(tmp_path):
    quickstart = (ROOT / "sweeps" / "examples" / "quickstart.yaml").read_text()
    assert "learning_rate: 0.003" in quickstart
    for spelling, value in (("3e-4", 3e-4), ("1e-3", 1e-3), ("3.0e-4", 3e-4)):
        path = tmp_path / "spec.yaml"
        path.write_text(quickstart.replace("learning_rate: 0.003", f"learning_rate: {spelling}"))
        spec = SweepSpec.model_validate(read_spec_file(path), strict=True)
        assert spec.template.training.learning_rate == value
    # PyYAML (YAML 1.1) would have handed the last spelling's sibling "3e-4" over as a string.
    import yaml

    assert yaml.safe_load("x: 3e-4")["x"] == "3e-4"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_spec_passes_strict_validation(example):
    SweepSpec.model_validate(read_spec_file(example), strict=True)


def test_an_alias_bomb_is_refused_before_it_is_built():
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 9):
        aliases = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{aliases}]")
    with pytest.raises(SpecFileError, match="alias bomb"):
        load_yaml("\n".join(lines))
    # A few anchors, as people use them, are fine.
    small = load_yaml("base: &b {epochs: 3}\nother: *b\nlist: [*b, *b]\n")
    assert small["list"] == [{"epochs": 3}, {"epochs": 3}]


def test_oversized_files_duplicate_keys_and_non_mappings_are_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: big\ndescription: " + "x" * 1_100_000 + "\n")
    with pytest.raises(SpecFileError, match="more than a sweep spec file may hold"):
        read_spec_file(big)
    with pytest.raises(SpecFileError, match="not valid YAML"):
        load_yaml("name: a\nname: b\n")
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(SpecFileError, match="must be a mapping"):
        read_spec_file(listing)


def test_ksweep_validate_says_what_is_wrong(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    bomb.write_text("\n".join(lines) + "\n")
    refused = _ksweep("validate", str(bomb))
    assert refused.returncode == 2 and "alias bomb" in refused.stdout + refused.stderr
    coerced = tmp_path / "coerced.yaml"
    quickstart = (ROOT / "sweeps" / "examples" / "quickstart.yaml").read_text()
    assert "    epochs: 8\n" in quickstart
    coerced.write_text(quickstart.replace("    epochs: 8\n", '    epochs: "8"\n'))
    strict = _ksweep("validate", str(coerced))
    assert strict.returncode == 2, strict.stdout
    assert "template.training.epochs" in strict.stdout + strict.stderr
    ok = _ksweep("validate", str(ROOT / "sweeps" / "examples" / "quickstart.yaml"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The trial budget is checked on the plan, with the line the spec's own checks print.
    assert "budget:\n  max_concurrent_trials: 2\n" in quickstart
    over = tmp_path / "over.yaml"
    over.write_text(quickstart.replace("budget:\n", "budget:\n  max_trials: 10\n"))
    refused = _ksweep("validate", str(over))
    assert refused.returncode == 2, refused.stdout
    assert ("budget.max_trials: the plan has 15 trials, over budget.max_trials = 10"
            in " ".join((refused.stdout + refused.stderr).split()))

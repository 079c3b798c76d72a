"""Trial configs are read by the one YAML 1.2 loader (workers.yaml_loader), as specs are."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.train.config import TrialConfig, load_trial_config
from workers.yaml_loader import SpecFileError


def test_yaml_1_2_numbers_are_numbers(tmp_path: Path) -> None:
    # PyYAML (YAML 1.1) reads 3e-4 as the string "3e-4"; YAML 1.2 reads a float.
    path = tmp_path / "trial.yaml"
    path.write_text("training:\n  learning_rate: 3e-4\n  epochs: 2\n")
    config = load_trial_config(path)
    assert config.training.learning_rate == pytest.approx(3e-4)
    assert config.training.epochs == 2


def test_an_empty_file_is_the_default_config(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_trial_config(path) == TrialConfig()


def test_a_list_is_refused_with_the_file_named(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(SpecFileError, match=r"list\.yaml: a trial config must be a mapping, got list"):
        load_trial_config(path)


def test_an_alias_bomb_is_refused_before_it_is_built(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1},"
              f" *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 7)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecFileError, match="alias bomb"):
        load_trial_config(path)


def test_json_is_read_as_json(tmp_path: Path) -> None:
    path = tmp_path / "trial.json"
    path.write_text('{"seed": 7}')
    assert load_trial_config(path).seed == 7

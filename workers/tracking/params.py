"""What a run's params hold: a flattened config, the code's commit and key package versions."""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

__all__ = ["flatten_config", "provenance_params"]


def _param_value(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        text = value
    elif isinstance(value, list | tuple):
        text = json.dumps(list(value), default=str)
    else:
        text = str(value)
    return text[:MAX_PARAM_VAL_LENGTH]


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten a nested config into MLflow params.

    Args:
        config: Mapping, possibly nested (dicts of dicts).
        prefix: Prepended to every key, joined with a dot.

    Returns:
        ``{"a.b.c": "value"}``: nested mappings become dotted keys (an empty nested
        mapping contributes nothing); lists and tuples are JSON-encoded (items that JSON
        cannot encode are written with ``str``); ``None`` becomes ``"None"``; everything
        else uses ``str``. Values are truncated to MLflow's limit on a param value
        (``MAX_PARAM_VAL_LENGTH``), so logging never fails on a long value.
    """
    flat: dict[str, str] = {}
    for key, value in config.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, dotted))
        else:
            flat[dotted] = _param_value(value)
    return flat


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
            timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def provenance_params() -> dict[str, str]:
    """Code version and key package versions, as the params ``provenance.*``.

    ``provenance.git_commit`` is the commit of the checkout the code runs from ("unknown"
    outside a git checkout, e.g. an installed wheel); ``provenance.git_dirty`` is "true" when
    tracked files differ from it (untracked files do not count), "unknown" without git.

    Read once per process (two ``git`` processes and four package look-ups, 7-40 ms, were
    paid again by every trial of a reused Ray actor): the code a process runs is the code it
    imported, whatever the checkout becomes later. A copy is returned.
    """
    return dict(_provenance())


@functools.cache
def _provenance() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    out = {
        "provenance.git_commit": commit or "unknown",
        "provenance.git_dirty": "unknown" if status is None else str(bool(status)).lower(),
    }
    for package in ("torch", "ray", "mlflow", "numpy"):
        try:
            out[f"provenance.{package}"] = version(package)
        except PackageNotFoundError:
            out[f"provenance.{package}"] = "not installed"
    return out

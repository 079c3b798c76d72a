"""Reading a sweep spec from YAML or JSON text or a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from sweeps.spec.sweep import SweepSpec
from workers.yaml_loader import load_yaml

__all__ = ["load_sweep_spec", "parse_sweep_spec"]


def parse_sweep_spec(text: str, format: Literal["yaml", "json"] = "yaml") -> SweepSpec:
    """Parse and validate a spec from YAML or JSON text.

    Raises:
        pydantic.ValidationError: an invalid spec (one entry per problem, with its path).
        ValueError: text that is not YAML/JSON, or not a mapping.
    """
    try:
        if format == "json":
            data = json.loads(text)
        elif format == "yaml":
            data = load_yaml(text)  # YAML 1.2, bounded (workers.yaml_loader)
        else:
            raise ValueError(f"format must be 'yaml' or 'json', got {format!r}")
    except json.JSONDecodeError as error:  # YAML errors: load_yaml's SpecFileError, a ValueError
        raise ValueError(f"the sweep spec is not valid {format.upper()}: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"a sweep spec must be a mapping, got {type(data).__name__}")
    return SweepSpec.model_validate(data)


def load_sweep_spec(path: str | Path) -> SweepSpec:
    """Load a spec from a file: ``.json`` is read as JSON, anything else as YAML.

    Raises:
        pydantic.ValidationError, ValueError: as :func:`parse_sweep_spec`. OSError: unreadable.
    """
    path = Path(path)
    format = "json" if path.suffix.lower() == ".json" else "yaml"
    return parse_sweep_spec(path.read_text(), format=format)

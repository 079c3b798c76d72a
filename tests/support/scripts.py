"""The repository's scripts (``scripts/*.py``, not a package) loaded as modules for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(file_name: str, module_name: str | None = None) -> ModuleType:
    """``scripts/<file_name>`` run as module ``module_name`` (default: the file's stem), listed
    in ``sys.modules`` first: a dataclass in it looks its module up there."""
    name = module_name or Path(file_name).stem
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / file_name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

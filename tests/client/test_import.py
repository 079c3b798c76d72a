"""``import ksweep`` stays light: no torch, Ray, MLflow or pandas in ``sys.modules``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
import ksweep
from ksweep import Client
roots = sorted({name.split('.')[0] for name in sys.modules})
print(json.dumps({"roots": roots, "all": ksweep.__all__}))
"""


def _probe() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout)


def test_import_loads_no_heavy_stack():
    probe = _probe()
    loaded = set(probe["roots"])
    assert not loaded & {"torch", "ray", "mlflow", "pandas", "matplotlib", "sklearn", "scipy",
                         "numpy", "fastapi", "sqlalchemy", "tqdm"}, loaded
    assert {"httpx", "pydantic", "ksweep"} <= loaded
    assert "Client" in probe["all"] and "Report" in probe["all"]



def test_the_command_line_loads_no_http_client_or_api_models_for_help():
    # `ksweep --help` builds the whole command tree: httpx (and its command line's rich and
    # click), the API's models and the service's settings load when a command runs.
    code = ("import json, sys, ksweep.cli\n"
            "print(json.dumps([m for m in ('httpx', 'pydantic', 'service.api.schemas', "
            "'service.settings', 'sqlalchemy', 'torch') if m in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert json.loads(out.stdout) == []

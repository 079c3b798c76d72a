"""The API's import stays light: nothing the routes do not need until the app starts.

The store (SQLAlchemy), the supervisor and its launchers (httpx, whose import brings its
command line's rich and click) load in the app's lifespan or a probe's first call; torch and
Ray never load in the API process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "mlflow", "rich", "click", "httpx", "sqlalchemy", "psutil",
         "service.orchestrator.supervisor", "service.orchestrator.launchers", "service.store.queries")


def _loaded_after(statement: str, watched: tuple[str, ...]) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps([m for m in {watched!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(done.stdout)


def test_importing_the_app_loads_no_store_supervisor_or_command_line_libraries():
    assert _loaded_after("import service.api.app", HEAVY) == []


def test_the_app_built_still_loads_none_of_them_until_its_lifespan():
    # create_app() builds every route and the OpenAPI document's parts; the lifespan builds
    # the services. Here only the first runs.
    statement = "from service.api.app import create_app; create_app().openapi()"
    assert _loaded_after(statement, HEAVY) == []

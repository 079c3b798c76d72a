"""Suite-wide set-up for parallel runs (pytest-xdist, ``make test``: docs/development.md).

Each pytest process (an xdist worker, or the lone process of a plain ``pytest``) gets its own
Ray temp folder through ``RAY_TMPDIR``: every local Ray a test starts (in-process or in a
driver, service or cluster child, which inherit the environment) keeps its sockets, logs and
``session_latest`` link there, so two workers' Rays never share a session folder.
Tests that must not overlap with others of their kind carry ``xdist_group(EXCLUSIVE)``.
"""

from __future__ import annotations

import os
import shutil
import tempfile

# The one xdist group of the suite (``--dist loadgroup`` runs its tests on one worker, one at
# a time): tests that kill whole process trees, restart Postgres or the MLflow server, start a
# Ray head or a cluster, or run Docker / chromium.
EXCLUSIVE = "exclusive"

_ray_tmp: str | None = None


def pytest_configure(config) -> None:
    global _ray_tmp
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    # Short, under /tmp: Ray's Unix socket paths must stay under 107 bytes.
    _ray_tmp = tempfile.mkdtemp(prefix=f"kr-{worker}-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = _ray_tmp


def pytest_unconfigure(config) -> None:
    if _ray_tmp is not None:
        shutil.rmtree(_ray_tmp, ignore_errors=True)

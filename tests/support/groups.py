"""The suite's pytest-xdist groups (docs/development.md, "Parallel runs").

``make test`` runs with ``--dist loadgroup``: every test marked :data:`exclusive` goes to the
same worker, one after another, while the other workers run the rest. A test belongs here when
it kills process trees or whole local Rays at a chosen moment, stops and restarts Postgres or the
MLflow server, starts a Ray head or the loopback cluster, or runs Docker / Compose / Chromium:
such tests either time their faults against the machine's pace or load it for minutes, and two
of them at once would make both slower and flakier. Everything else may run beside them.
"""

from __future__ import annotations

import pytest

GROUP = "exclusive"
exclusive = pytest.mark.xdist_group(GROUP)

# The client tests that share tests/client/conftest.py's session service and its ended sweep
# (about a minute to start and run): together on one worker, they pay for it once, not once
# per worker.
CLIENT_SERVICE = "client_service"
client_service = pytest.mark.xdist_group(CLIENT_SERVICE)

# The dataset API tests that share tests/service/test_datasets_api.py's module service: on one
# worker, one service start instead of one per worker that runs a few of them.
DATASETS_SERVICE = "datasets_service"
datasets_service = pytest.mark.xdist_group(DATASETS_SERVICE)

# The compiled cohort step's tests: torch.compile's first graph in a process pays a one-time
# set-up (about 2 CPU-s); on one worker that is paid once, not once per worker.
COMPILE = "compile"
compile_tests = pytest.mark.xdist_group(COMPILE)

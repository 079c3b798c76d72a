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

# Modules whose tests share one costly module fixture (models trained to a target rate, the
# docs site built with --strict): on one worker the fixture is built once. Spread over the
# workers, each built its own: the two target-rate modules trained their models three times
# in one run (about 40 CPU-s over what once costs), the site was built twice.
RATE_TEXT = "rate_text"
rate_text = pytest.mark.xdist_group(RATE_TEXT)
RATE_TRAINING = "rate_training"
rate_training = pytest.mark.xdist_group(RATE_TRAINING)
DOCS_SITE = "docs_site"
docs_site = pytest.mark.xdist_group(DOCS_SITE)

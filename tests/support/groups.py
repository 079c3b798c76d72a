"""The suite's one pytest-xdist group (docs/development.md, "Parallel runs").

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

"""schemathesis over ``/openapi.json`` against the real (paused) service: no input the schema
allows may yield a server error, every response must match its documented status, content
type and schema, and no input the schema forbids may be accepted. The stateful phase chains
operations through the document's OpenAPI links (service/api/links.py): POST /sweeps, then
GET, trials, report and cancel on the sweep it created."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import PAUSED_QUEUE, ServiceProcess, auth

# One check is off, for a reason of the contract, not of convenience: positive_data_acceptance,
# since cross-field rules of a spec (a plan over budget.max_trials, grid alphas with Optuna...)
# are not expressible in JSON schema, so a schema-valid spec may rightly be refused with a 422
# naming the fields. Every other check stays on, negative_data_rejection included: bodies are
# read strictly (service/api/strict_body.py), so a schema-invalid body must be refused. (It found
# ``tags: {"k": false}`` accepted as the text "False"; booleans are now refused and the schema
# says that a number is read as its text.)
# And negative_data_rejection for the one array query parameter, GET .../history's `metrics`: a
# bare string ("p") violates its schema (an array or null) yet goes on the wire exactly as the
# one-item array ["p"] does, so no server can refuse it (schemathesis reads it as ST201).
# Both exceptions live in the schemathesis.toml below: a --checks flag would override the
# per-operation one.
CONFIG = """
[checks]
positive_data_acceptance.enabled = false

[[operations]]
include-name = "GET /api/v1/sweeps/{sweep_id}/history"
checks.negative_data_rejection.enabled = false
"""
# The links that service/api/links.py adds (4 responses holding a sweep x 4 operations on it).
DECLARED_LINKS = 16
STATEFUL = re.compile(r"Scenarios:\s+(\d+)\s+API Links:\s+(\d+) covered / (\d+) selected / "
                      r"(\d+) total")


def cancelled_sweeps(service) -> int:
    response = httpx.get(service.url + "/sweeps", params={"state": "cancelled", "limit": 1},
                         headers=auth("alice"), timeout=10)
    response.raise_for_status()
    return response.json()["total"]


@pytest.fixture(scope="module")
def fuzzed_service(tmp_path_factory):
    """A paused service of its own (as ``paused_service``): what the stateful phase reaches
    through its links depends on what the service holds, so no other test's sweeps are there
    (beside them, on a shared service, a run chained 13 scenarios instead of 21)."""
    service = ServiceProcess(tmp_path_factory.mktemp("fuzzed"), **PAUSED_QUEUE)
    service.start()
    yield service
    service.stop()


def test_schemathesis_finds_no_server_error_or_contract_violation(fuzzed_service, tmp_path: Path):
    openapi = fuzzed_service.url.removesuffix("/api/v1") + "/openapi.json"
    cancelled_before = cancelled_sweeps(fuzzed_service)
    command = [
        str(Path(sys.executable).with_name("st")), "run", openapi,
        "--max-examples", "30", "--seed", "20261202", "--no-shrink",
        "--header", f"Authorization: {auth('alice')['Authorization']}",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]
    (tmp_path / "schemathesis.toml").write_text(CONFIG)  # read from the working directory
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    # It really exercised the API: every operation tested, a few hundred cases generated.
    assert "Tested: 19" in output, output[-3000:]
    cases = next(line for line in output.splitlines() if re.match(r"\s*\d+ generated", line))
    assert int(cases.split()[0]) >= 200, cases
    # The stateful phase really chained operations through links, not only ran.
    scenarios, covered, selected, total = map(int, STATEFUL.search(output).groups())
    print(f"stateful: {scenarios} scenarios, links {covered} covered / {selected} selected / "
          f"{total} total; {cases}")
    assert total >= DECLARED_LINKS and selected == total, output[-3000:]
    assert scenarios >= 20 and covered >= 8, output[-3000:]
    # ... and with real ids: only a link from POST /sweeps to its cancel can cancel a sweep of a
    # paused service (every other phase sends ids that do not exist).
    assert cancelled_sweeps(fuzzed_service) > cancelled_before

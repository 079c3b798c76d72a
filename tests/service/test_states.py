"""Sweep and trial states: one definition (sweeps.status's StrEnums), the same values as
before in the OpenAPI document, the store and the CLI."""

from __future__ import annotations

import yaml

from ksweep.cli.client import EXIT_CODES
from ksweep.cli.training import COUNTER_COLUMNS
from service.api.app import create_app
from service.lifecycle import ACTIVE_SWEEP_STATES, TERMINAL_SWEEP_STATES
from service.settings import Settings
from sweeps.status import COUNTERS, SweepState, SweepStatus, TrialState, finished_state
from workers.contract import TrainingStatus

SWEEP_VALUES = ["queued", "running", "succeeded", "failed", "cancelled"]
TRIAL_VALUES = ["pending", "running", "done", "stopped", "failed"]


def test_the_values_are_todays() -> None:
    # Stored in the sweeps table and documented: a renamed value would need a migration.
    assert [s.value for s in SweepState] == SWEEP_VALUES
    assert [s.value for s in TrialState] == TRIAL_VALUES
    assert ACTIVE_SWEEP_STATES == ("queued", "running")
    assert TERMINAL_SWEEP_STATES == ("succeeded", "failed", "cancelled")
    assert all(type(s) is str for s in ACTIVE_SWEEP_STATES + TERMINAL_SWEEP_STATES)
    assert {EXIT_CODES[s] for s in TERMINAL_SWEEP_STATES} == {0, 1, 3}


def test_the_progress_record_holds_plain_strings() -> None:
    # YAML (and MLflow tags) take no enum member: the record, the counters and the CLI's
    # columns hold the members' values.
    assert COUNTERS == ("total", "pending", "running", "done", "failed", "stopped")
    assert COUNTER_COLUMNS == ("pending", "running", "done", "stopped", "failed")  # the live view's
    ended = [finished_state(True, 2, 2), finished_state(False, 2, 2), finished_state(False, 1, 2)]
    assert ended == ["failed", "done", "stopped"]
    status = SweepStatus("s1", trials=[{"trial_id": "t", "state": ended[1]}])
    assert all(type(s) is str for s in (*COUNTERS, *COUNTER_COLUMNS, *ended, status.state))
    assert yaml.safe_load(yaml.safe_dump(status.to_dict()))["state"] == "running"
    # A cohort member's training status, stored in cohort checkpoints.
    assert [s.value for s in TrainingStatus] == ["running", "finished", "stopped", "failed"]


def test_the_openapi_document_keeps_its_inline_string_enums() -> None:
    document = create_app(Settings()).openapi()
    schemas = document["components"]["schemas"]
    assert "SweepState" not in schemas and "TrialState" not in schemas  # no new $ref schema
    assert schemas["Sweep"]["properties"]["state"] == {
        "enum": SWEEP_VALUES, "title": "State", "type": "string"}
    assert schemas["Trial"]["properties"]["state"] == {
        "enum": TRIAL_VALUES, "title": "State", "type": "string"}
    filters = {path: next(p for p in op["get"]["parameters"] if p["name"] == "state")["schema"]
               for path, op in document["paths"].items()
               if path in ("/api/v1/sweeps", "/api/v1/sweeps/{sweep_id}/trials")}
    assert filters["/api/v1/sweeps"]["anyOf"][0] == {"enum": SWEEP_VALUES, "type": "string"}
    assert filters["/api/v1/sweeps/{sweep_id}/trials"]["anyOf"][0] == {
        "enum": TRIAL_VALUES, "type": "string"}

"""``POST /sweeps:validate?pilot=ID``: the plan's power from a stored pilot sweep's report, in
process on a real SQLite store (no sweep runs: the queue is paused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.settings import Settings
from service.store.queries import Store
from sweeps.status import SweepStatus

ROOT = Path(__file__).resolve().parents[2]
PILOT = ROOT / "docs" / "science" / "real_text_wordnet" / "nouns" / "report.json"
HEADERS = {"Authorization": "Bearer alice-token"}


@pytest.fixture
def client(tmp_path):
    settings = Settings(sweep_root=tmp_path, api_tokens="alice:alice-token",
                        max_concurrent_sweeps=0)
    store = Store(settings.store_url)
    try:
        for sweep_id, report in (("pilot", json.loads(PILOT.read_text())), ("queued", None)):
            store.create_sweep(sweep_id=sweep_id, owner="alice", name=sweep_id,
                               spec={"name": sweep_id}, request_hash=sweep_id,
                               idempotency_key=None, total=50)
            if report is not None:
                assert store.mark_launched(sweep_id, launcher="local", handle="pid:1@h", attempts=1)
                assert store.publish_status(SweepStatus(sweep_id, state="succeeded", total=50, done=50),
                                            report=report, extension_count=0)
    finally:
        store.close()
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_validate_with_a_pilot_answers_the_power_of_the_planned_family(client):
    spec = yaml.safe_load((ROOT / "sweeps" / "examples" / "wordnet_nouns.yaml").read_text())
    spec["seeds"], spec["budget"]["max_trials"] = 12, 200
    answer = client.post("/api/v1/sweeps:validate", params={"pilot": "pilot"}, json=spec,
                         headers=HEADERS)
    assert answer.status_code == 200, answer.text
    power = answer.json()["power"]
    assert power["pilot"] == "a398c4741405" and power["seeds"] == 12
    assert power["family_size"] == 4 and power["level"] == pytest.approx(0.0125)
    sds = sorted(round(e["paired_sd"], 3) for e in power["entries"])
    assert sds == [0.03, 0.044, 0.046, 0.055]
    assert power["seeds_needed"] > 12 and all(e["detectable"] < 0.113 for e in power["entries"])
    plain = client.post("/api/v1/sweeps:validate", json=spec, headers=HEADERS)
    assert plain.status_code == 200 and plain.json()["power"] is None
    # No report yet: 409; no such sweep: 404; another metric: 422 naming the field.
    assert client.post("/api/v1/sweeps:validate", params={"pilot": "queued"}, json=spec,
                       headers=HEADERS).status_code == 409
    assert client.post("/api/v1/sweeps:validate", params={"pilot": "nosuch"}, json=spec,
                       headers=HEADERS).status_code == 404
    spec["analysis"]["metric"] = "latent_nmi"
    refused = client.post("/api/v1/sweeps:validate", params={"pilot": "pilot"}, json=spec,
                          headers=HEADERS)
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == "pilot"

"""The REST contract against a real uvicorn process whose queue is paused (nothing trains)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
from conftest import TOKENS, auth, spec_dict, tiny_spec

from tests.support.datasets import register, strategy_table

PROBLEM = "application/problem+json"


def _submit(client, owner="alice", key=None, **changes):
    headers = auth(owner) | ({"Idempotency-Key": key} if key else {})
    return client.post("/sweeps", json=tiny_spec(**changes), headers=headers)


def _problem(response, status):
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["status"] == status and body["title"]
    return body


def test_submit_returns_201_with_a_queued_sweep_at_once(paused_service):
    with paused_service.client() as client:
        response = _submit(client, name="submitted")
        assert response.status_code == 201, response.text
        sweep = response.json()
        assert response.headers["Location"] == f"/api/v1/sweeps/{sweep['id']}"
        assert sweep["state"] == "queued" and sweep["owner"] == "alice"
        # tiny_spec: 4 rows, 3 trials (uniform is one trial at both alphas).
        assert sweep["counters"] == {"total": 3, "pending": 3, "running": 0, "done": 0,
                                     "failed": 0, "stopped": 0}
        assert sweep["progress"] == 0.0 and sweep["driver"]["attempts"] == 0
        fetched = client.get(f"/sweeps/{sweep['id']}").json()
        assert fetched["id"] == sweep["id"] and fetched["name"] == "submitted"
        assert fetched["created_at"].endswith("+00:00") or fetched["created_at"].endswith("Z")
        assert client.get(f"/sweeps/{sweep['id']}/trials").json() == {
            "items": [], "total": 0, "limit": 100, "offset": 0}
        report = client.get(f"/sweeps/{sweep['id']}/report")
        assert _problem(report, 409)["sweep_id"] == sweep["id"]


def test_mutations_need_a_valid_token(paused_service):
    with paused_service.client() as client:
        missing = _problem(client.post("/sweeps", json=tiny_spec()), 401)
        assert "Bearer" in missing["detail"]
        assert client.post("/sweeps", json=tiny_spec()).headers["WWW-Authenticate"] == "Bearer"
        wrong = client.post("/sweeps", json=tiny_spec(), headers={"Authorization": "Bearer nope"})
        assert _problem(wrong, 401)["detail"] == "the bearer token is not valid"
        basic = client.post("/sweeps", json=tiny_spec(), headers={"Authorization": "Basic eDp5"})
        _problem(basic, 401)
        sweep_id = _submit(client).json()["id"]
        _problem(client.post(f"/sweeps/{sweep_id}/cancel"), 401)
        # Reads are open by default (KSWEEP_READ_AUTH unset).
        assert client.get(f"/sweeps/{sweep_id}").status_code == 200


def test_only_the_owner_or_an_admin_may_cancel(paused_service):
    with paused_service.client() as client:
        first = _submit(client, owner="alice").json()["id"]
        forbidden = _problem(client.post(f"/sweeps/{first}/cancel", headers=auth("bob")), 403)
        assert "alice" in forbidden["detail"]
        assert client.get(f"/sweeps/{first}").json()["state"] == "queued"
        own = client.post(f"/sweeps/{first}/cancel", headers=auth("alice"))
        assert own.status_code == 200 and own.json()["state"] == "cancelled"
        assert own.json()["finished_at"] is not None
        again = client.post(f"/sweeps/{first}/cancel", headers=auth("alice"))
        assert again.status_code == 200 and again.json()["state"] == "cancelled"  # idempotent
        second = _submit(client, owner="alice").json()["id"]
        by_admin = client.post(f"/sweeps/{second}/cancel", headers=auth("admin"))
        assert by_admin.status_code == 200 and by_admin.json()["state"] == "cancelled"
        _problem(client.post("/sweeps/doesnotexist/cancel", headers=auth("alice")), 404)


def test_idempotency_key_same_body_same_sweep_other_body_409(paused_service):
    key = f"key-{uuid.uuid4()}"
    with paused_service.client() as client:
        first = _submit(client, key=key, name="idem")
        assert first.status_code == 201
        replay = _submit(client, key=key, name="idem")
        assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
        assert replay.json()["id"] == first.json()["id"]
        # The same spec written differently (key order, 0 vs 0.0) is the same body.
        reordered = dict(reversed(list(tiny_spec(name="idem", alpha=[0.0, 1.0]).items())))
        same = client.post("/sweeps", content=json.dumps(reordered),
                           headers=auth("alice") | {"Idempotency-Key": key,
                                                    "Content-Type": "application/json"})
        assert same.status_code == 200 and same.json()["id"] == first.json()["id"]
        conflict = _problem(_submit(client, key=key, name="idem", alpha=[0, 2]), 409)
        assert conflict["sweep_id"] == first.json()["id"]
        # Keys are per owner: bob's identical key makes bob's own sweep.
        other = _submit(client, owner="bob", key=key, name="idem")
        assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
        listed = client.get("/sweeps", params={"owner": "alice", "limit": 500}).json()
        assert [s["id"] for s in listed["items"]].count(first.json()["id"]) == 1


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"alpha": {"low": -1, "high": 2}}, "alpha", "greater than or equal to 0"),
        ({"loss_stacks": ["uniform", "nope"]}, "loss_stacks", "nope"),
        ({"template.training.epochz": 3}, "template.training.epochz", "Extra inputs"),
        ({"objective": {"metrics": ["val/latent_nmx"], "modes": ["max"]}}, "objective", "val/latent_nmx"),
        ({"search": {"kind": "optuna", "sampler": "tpe"}}, "alpha", "search.kind=grid"),
        ({"models": ["transformer"]}, "models.0", "discrete"),
    ],
)
def test_invalid_specs_are_422_with_field_paths(paused_service, changes, field, fragment):
    with paused_service.client() as client:
        before = client.get("/sweeps").json()["total"]
        response = client.post("/sweeps", json=tiny_spec(**changes), headers=auth("alice"))
        body = _problem(response, 422)
        assert body["title"] == "Invalid sweep spec"
        assert any(e["field"].startswith(field) for e in body["errors"]), body
        assert fragment in json.dumps(body)
        assert client.get("/sweeps").json()["total"] == before  # nothing stored


def test_non_json_and_oversized_bodies(paused_service):
    with paused_service.client() as client:
        garbage = client.post("/sweeps", content=b"{not json", headers=auth("alice") | {
            "Content-Type": "application/json"})
        _problem(garbage, 422)
        huge = {"name": "huge", "description": "x" * 2_000_000}
        too_large = client.post("/sweeps", json=huge, headers=auth("alice"))
        assert "KSWEEP_MAX_BODY_BYTES" in _problem(too_large, 413)["detail"]


def test_trial_cap_and_validate_dry_run(paused_service):
    with paused_service.client() as client:
        # 5 alphas x 2 stacks x 30 seeds = 300 rows; dedup runs uniform once per seed: 180 trials.
        big = tiny_spec(alpha=[0, 0.5, 1, 2, 4], seeds=30, **{"budget.max_trials": 500})
        body = _problem(client.post("/sweeps:validate", json=big), 422)
        assert body["errors"][0]["field"] == "budget.max_trials"
        assert "180 trials" in body["errors"][0]["message"]
        _problem(client.post("/sweeps", json=big, headers=auth("alice")), 422)
        plan = client.post("/sweeps:validate", json=spec_dict())
        assert plan.status_code == 200
        plan = plan.json()
        # quickstart: 27 rows, 15 trials (uniform once per seed stands in 5 rows).
        assert plan["trial_count"] == 15 and plan["total_epochs"] == 15 * 8
        assert (plan["trials_requested"], plan["trials_after_dedup"],
                plan["trials_saved_by_dedup"]) == (27, 15, 12)
        assert {(r["alpha"], r["loss_stack"]) for r in plan["rows"]} == {
            (a, s) for a in (0.0, 1.0, 2.0)
            for s in ("uniform", "raw_token_weighted", "concentration_corrected")}
        assert sum(bool(t["shared_by"]) for t in plan["trials"]) == 3
        # Each trial's run and units: 8 epochs x ceil(1024 / 64) steps; beta 1 x mean length 2 + 5.
        assert plan["train"]["rows"] == 1024 and plan["train"]["mean_target_length"] == 7.0
        assert {(t["total_steps"], t["elbo_beta"]) for t in plan["trials"]} == {(128, "7")}
        assert plan["warnings"] == []


def test_validate_reads_a_datasets_train_split_from_its_registry_summary(paused_service):
    root = Path(paused_service.env["KSWEEP_SWEEP_ROOT"]) / "datasets"
    record = register(root, strategy_table(rows=80, split=True), "validate_lengths")
    rows = record.summary["rows_per_split"]["train"]
    mean = record.summary["tokens"]["train"]["y"] / rows
    spec = tiny_spec(**{"template.data": {"dataset": "validate_lengths"}, "template.base": {"kind": "learned"},
                        "common_terms": {"kl": {"weight": 2.0, "options": {"anneal": "linear"}}}})
    with paused_service.client() as client:
        plan = client.post("/sweeps:validate", json=spec)
        assert plan.status_code == 200, plan.text
        plan = plan.json()
    assert plan["train"]["rows"] == rows and plan["train"]["mean_target_length"] == pytest.approx(mean)
    steps = 3 * -(-rows // 64)
    uniform = next(t for t in plan["trials"] if t["loss_stack"] == "uniform")
    assert uniform["total_steps"] == steps and uniform["elbo_beta"] == f"{2.0 * mean:.3g}"
    assert uniform["schedule_overruns"] == ["KL warm-up of 1000 steps"]
    assert plan["warnings"] and f"run {steps} optimizer steps" in plan["warnings"][0]


def test_validate_shows_cohorts_and_refuses_them_with_asha(paused_service):
    with paused_service.client() as client:
        plan = client.post("/sweeps:validate", json=spec_dict(**{"resources.cohort_size": 4}))
        assert plan.status_code == 200, plan.text
        plan = plan.json()
        # quickstart's 15 trials in cohorts of 4: 4 + 4 + 4 + 3, each trial in one cohort.
        assert plan["cohort_size"] == 4 and [len(c) for c in plan["cohorts"]] == [4, 4, 4, 3]
        assert sorted(t for c in plan["cohorts"] for t in c) == list(range(15))
        body = _problem(client.post("/sweeps:validate", json=spec_dict(**{
            "resources.cohort_size": 4, "scheduler.kind": "asha"})), 422)
        assert body["errors"][0]["field"] == "resources.cohort_size"
        assert "set resources.cohort_size: 1" in body["errors"][0]["message"]


def test_active_sweeps_per_owner_cap_is_429_with_retry_after(make_service):
    service = make_service(KSWEEP_MAX_CONCURRENT_SWEEPS="0", KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER="2")
    with service.client() as client:
        assert _submit(client).status_code == 201
        assert _submit(client).status_code == 201
        limited = client.post("/sweeps", json=tiny_spec(), headers=auth("alice"))
        body = _problem(limited, 429)
        assert limited.headers["Retry-After"] == "30" and "2 sweeps" in body["detail"]
        assert _submit(client, owner="bob").status_code == 201  # the cap is per owner
        queued = client.get("/sweeps", params={"owner": "alice", "state": "queued"}).json()
        client.post(f"/sweeps/{queued['items'][0]['id']}/cancel", headers=auth("alice"))
        assert _submit(client).status_code == 201  # room again


def test_list_is_paginated_newest_first_and_filters(paused_service):
    with paused_service.client() as client:
        ids = [_submit(client, owner="bob", name=f"page-{i}").json()["id"] for i in range(3)]
        page = client.get("/sweeps", params={"owner": "bob", "limit": 2}).json()
        assert page["limit"] == 2 and page["total"] >= 3 and len(page["items"]) == 2
        assert [s["id"] for s in page["items"]] == ids[::-1][:2]
        rest = client.get("/sweeps", params={"owner": "bob", "limit": 2, "offset": 2}).json()
        assert ids[0] in [s["id"] for s in rest["items"]]
        _problem(client.get("/sweeps", params={"state": "sleeping"}), 422)
        _problem(client.get("/sweeps", params={"limit": 0}), 422)


def test_objectives_health_and_readiness(paused_service):
    with paused_service.client() as client:
        objectives = client.get("/objectives").json()
        terms = {t["name"]: t for t in objectives["terms"]}
        assert set(terms) == {"uniform", "normalized_uniform", "token_weighted",
                              "concentration_corrected", "train_kappa_corrected",
                              "normalized_concentration_corrected", "kl", "bag_of_words"}
        assert "free_bits" in terms["kl"]["options"]["properties"] and terms["kl"]["weight"] == "beta"
        assert {p["name"] for p in objectives["presets"]} >= {"uniform", "ncc", "raw_plus_ncc"}
        assert "val/latent_nmi" in objectives["metrics"]
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 200
        checks = ready.json()["checks"]
        assert checks["store"] == {"ok": True, "detail": "sqlite"}
        assert checks["mlflow"]["ok"] and checks["ray"]["ok"]


def test_read_auth_protects_reads_when_enabled(make_service):
    service = make_service(KSWEEP_MAX_CONCURRENT_SWEEPS="0", KSWEEP_READ_AUTH="true")
    with service.client() as client:
        _problem(client.get("/sweeps"), 401)
        assert client.get("/sweeps", headers=auth("bob")).status_code == 200
        assert client.get("/healthz").status_code == 200  # probes stay open


def test_openapi_documents_every_route_and_error(paused_service):
    document = httpx.get(paused_service.url.removesuffix("/api/v1") + "/openapi.json").json()
    paths = document["paths"]
    assert set(paths) >= {"/api/v1/sweeps", "/api/v1/sweeps/{sweep_id}", "/api/v1/sweeps/{sweep_id}/trials",
                          "/api/v1/sweeps/{sweep_id}/cancel", "/api/v1/sweeps/{sweep_id}/report",
                          "/api/v1/sweeps:validate", "/api/v1/objectives", "/api/v1/healthz",
                          "/api/v1/readyz"}
    submit = paths["/api/v1/sweeps"]["post"]
    assert {"201", "200", "401", "409", "413", "422", "429"} <= set(submit["responses"])
    assert submit["requestBody"]["content"]["application/json"]["examples"]["quickstart"]["value"]["name"] == "quickstart"
    assert "application/problem+json" in submit["responses"]["422"]["content"]
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert not any(token in json.dumps(document) for token in TOKENS.values())


def test_hot_reads_answer_what_the_fastapi_routes_answer(paused_service):
    """GET /sweeps/{id} and GET /sweeps are answered ahead of FastAPI (service.api.hot_reads);
    a query string the hot path leaves to FastAPI (any on a sweep's path, an unknown parameter on
    the list) shows that FastAPI's routes give the same status, headers and bytes."""
    with paused_service.client() as client:
        ids = [_submit(client, owner="bob", name=f"hot-{i}").json()["id"] for i in range(3)]
        for sweep_id in ids:
            hot = client.get(f"/sweeps/{sweep_id}")
            routed = client.get(f"/sweeps/{sweep_id}", params={"via": "fastapi"})
            assert hot.status_code == routed.status_code == 200
            assert hot.content == routed.content and hot.json()["id"] == sweep_id
            for header in ("content-type", "content-length"):
                assert hot.headers[header] == routed.headers[header]
            assert hot.headers["content-type"] == "application/json"
        # "+2" and "2.0": odd but valid, read by the one query model both paths validate with
        for params in ({}, {"limit": 2}, {"owner": "bob", "limit": 3, "offset": 1},
                       {"state": "queued", "owner": "bob"}, {"limit": "+2"}, {"limit": "2.0"}):
            hot = client.get("/sweeps", params=params)
            routed = client.get("/sweeps", params={**params, "via": "fastapi"})
            assert hot.status_code == routed.status_code == 200
            assert hot.content == routed.content
            assert hot.headers["content-length"] == routed.headers["content-length"]
        # what the hot path leaves to FastAPI is FastAPI's problem document
        missing = _problem(client.get("/sweeps/nosuchsweep"), 404)
        assert missing["instance"] == "/api/v1/sweeps/nosuchsweep"
        assert _problem(client.get("/sweeps/bad.id"), 422)["errors"][0]["field"] == "path.sweep_id"
        assert _problem(client.get("/sweeps", params={"limit": "5.5"}), 422)["errors"]
        assert client.head(f"/sweeps/{ids[0]}").status_code == 405
        assert client.get(f"/sweeps/{ids[0]}/").status_code in (307, 404)


def test_the_access_log_is_off_by_default_and_on_with_the_switch(make_service):
    """KSWEEP_ACCESS_LOG: off, no line per request (uvicorn's are `"GET /path HTTP/1.1" 200`)."""
    off = make_service(KSWEEP_MAX_CONCURRENT_SWEEPS="0")
    with off.client() as client:
        assert client.get("/sweeps").status_code == 200
        assert client.get("/sweeps/nosuchsweep").status_code == 404
        assert client.get("/healthz").status_code == 200
    off.stop()
    assert "Application startup complete" in off.log_tail(100_000)
    assert "HTTP/1.1" not in off.log_tail(100_000)
    on = make_service(KSWEEP_MAX_CONCURRENT_SWEEPS="0", KSWEEP_ACCESS_LOG="true")
    with on.client() as client:
        assert client.get("/sweeps").status_code == 200
        assert client.get("/sweeps/nosuchsweep").status_code == 404
    on.stop()
    log = on.log_tail(100_000)
    assert '"GET /api/v1/sweeps HTTP/1.1" 200' in log
    assert '"GET /api/v1/sweeps/nosuchsweep HTTP/1.1" 404' in log

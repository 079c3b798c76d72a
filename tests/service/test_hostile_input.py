"""Hostile request bodies against a real uvicorn process (paused queue): every one is refused
with a 422 problem document naming the offending field, none gives a 5xx, none is stored."""

from __future__ import annotations

import json

import pytest
from conftest import auth, tiny_spec

PROBLEM = "application/problem+json"


def _with(**changes) -> bytes:
    return json.dumps(tiny_spec(changes.pop("name", "hostile"), **changes)).encode()


def _raw(replace_from: str, replace_to: str, **changes) -> bytes:
    """The tiny spec as JSON text with one textual substitution (for what json.dumps won't write)."""
    text = _with(**changes).decode()
    assert replace_from in text, replace_from
    return text.replace(replace_from, replace_to, 1).encode()


def _nested(depth: int) -> dict:
    node: dict = {"leaf": "x"}
    for _ in range(depth):
        node = {"x": node}
    return node


BASE = tiny_spec(name="hostile")
WITHOUT_NAME = json.dumps({k: v for k, v in BASE.items() if k != "name"}).encode()

# (case, body bytes, the field the problem must name). "(body)" is the body as a whole.
CORPUS: list[tuple[str, bytes, str]] = [
    ("wrong type: list for an int", _with(**{"template.training.epochs": [6]}), "template.training.epochs"),
    ("bool as int count", _with(seeds=True), "seeds"),
    ("bool as float", _with(**{"resources.cpu": True}), "resources.cpu"),
    ("string as int", _with(**{"template.training.epochs": "6"}), "template.training.epochs"),
    ("string as float", _with(**{"template.training.learning_rate": "3e-4"}), "template.training.learning_rate"),
    ("float for an int", _with(**{"template.training.epochs": 6.0}), "template.training.epochs"),
    ("number for a string", _with(name=123), "name"),
    ("NaN", _raw('"learning_rate": 0.003', '"learning_rate": NaN'), "template.training.learning_rate"),
    ("Infinity", _raw('"learning_rate": 0.003', '"learning_rate": Infinity'), "template.training.learning_rate"),
    ("-Infinity", _raw('"learning_rate": 0.003', '"learning_rate": -Infinity'), "template.training.learning_rate"),
    ("float overflowing to inf", _raw('"learning_rate": 0.003', '"learning_rate": 1e400'), "template.training.learning_rate"),
    ("huge integer", _raw('"epochs": 3', '"epochs": ' + "9" * 50), "template.training.epochs"),
    ("duplicated top-level key", _raw('"name": "hostile"', '"name": "hostile", "name": "other"'), "name"),
    ("duplicated nested key", _raw('"epochs": 3', '"epochs": 3, "epochs": 4'), "template.training.epochs"),
    ("nesting deeper than the limit", _with(tags=_nested(40)), "tags"),
    ("nesting that overflows the parser", b'{"tags": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "(body)"),
    ("long list", _with(seeds=list(range(5000))), "seeds"),
    ("long string", _with(description="x" * 20_000), "description"),
    ("unknown field", _with(epochz=3), "epochz"),
    ("unknown nested field", _with(**{"template.training.epochz": 3}), "template.training.epochz"),
    ("null where required", _with(name=None), "name"),
    ("required field missing", WITHOUT_NAME, "name"),
    ("unicode name outside the name alphabet", _with(name="α-sweep"), "name"),
    ("lone surrogate", _raw('"description": ""', '"description": "\\ud800"', description=""), "description"),
    ("NUL in a string", _with(description="a\x00b"), "description"),
    ("empty body", b"", "(body)"),
    ("not JSON", b'{"name": ', "(body)"),
    ("not UTF-8", b'{"name": "\xff\xfe"}', "(body)"),
    ("JSON array", b"[1, 2, 3]", "(body)"),
    ("JSON string", b'"quickstart"', "(body)"),
    ("JSON null", b"null", "(body)"),
    ("negative count", _with(**{"template.training.epochs": -1}), "template.training.epochs"),
]


@pytest.mark.parametrize("endpoint", ["/sweeps", "/sweeps:validate"])
def test_every_hostile_body_is_a_422_naming_its_field(paused_service, endpoint):
    failures = []
    with paused_service.client() as client:
        before = client.get("/sweeps", params={"limit": 1}).json()["total"]
        for case, body, field in CORPUS:
            response = client.post(endpoint, content=body, headers={
                **auth("alice"), "Content-Type": "application/json"})
            named = []
            if response.headers.get("content-type", "").startswith(PROBLEM):
                problem = response.json()
                named = [error["field"] for error in problem.get("errors") or []]
            if response.status_code != 422 or not any(n.startswith(field) for n in named):
                failures.append(f"{case}: {response.status_code} naming {named}: {response.text[:300]}")
        # Nothing of the corpus was stored (the paused queue keeps every accepted sweep).
        after = client.get("/sweeps", params={"limit": 1}).json()["total"]
    assert not failures, "\n".join(failures)
    assert after == before
    assert len(CORPUS) >= 19


def test_refusals_say_why(paused_service):
    with paused_service.client() as client:
        def problem(body: bytes) -> dict:
            response = client.post("/sweeps", content=body, headers={
                **auth("alice"), "Content-Type": "application/json"})
            assert response.status_code == 422, response.text
            return response.json()

        duplicated = problem(_raw('"name": "hostile"', '"name": "a", "name": "b"'))
        assert "duplicated key" in duplicated["errors"][0]["message"]
        nan = problem(_raw('"learning_rate": 0.003', '"learning_rate": NaN'))
        assert "NaN" in nan["detail"]
        coerced = problem(_with(**{"template.training.epochs": "6"}))
        assert coerced["type"].endswith("invalid-spec") and "integer" in coerced["detail"]


def test_an_ordinary_spec_and_unicode_text_pass_strict_validation(paused_service):
    text = "α ≥ 2 — ünïcode 🚀"
    spec = tiny_spec(name="unicode-ok", description=text, tags={"note": text})
    with paused_service.client() as client:
        response = client.post("/sweeps", content=json.dumps(spec, ensure_ascii=False).encode(),
                               headers={**auth("alice"), "Content-Type": "application/json"})
        assert response.status_code == 201, response.text
        sweep_id = response.json()["id"]
        plan = client.post("/sweeps:validate", json=spec, headers=auth("alice"))
        assert plan.status_code == 200, plan.text
        # tiny_spec: uniform and raw_plus_ncc at alpha 0 and 1; uniform runs once for both.
        assert (plan.json()["trials_requested"], plan.json()["trial_count"]) == (4, 3), plan.text
        assert client.get(f"/sweeps/{sweep_id}").json()["name"] == "unicode-ok"

"""Extending and comparing sweeps over REST, the Python client and the CLI, against a real
uvicorn process whose queue is paused (nothing trains: every refusal and record is checked
before a trial would run)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT, TOKENS, auth, spec_dict

from ksweep import Client, Conflict, Forbidden, InvalidRequest

PROBLEM = "application/problem+json"


def _problem(response, status):
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    return response.json()


def _fields(response, status=422) -> dict[str, str]:
    return {e["field"]: e["message"] for e in _problem(response, status)["errors"]}


def _submit(client, owner="alice", **changes) -> str:
    response = client.post("/sweeps", json=spec_dict(**changes), headers=auth(owner))
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_the_dry_run_shows_new_rows_and_existing_trials(paused_service):
    with paused_service.client() as client:
        sweep_id = _submit(client, name="grow-dry")
        plan = client.post(f"/sweeps/{sweep_id}/extend:validate", json={"alpha": [0.5]})
        assert plan.status_code == 200, plan.text
        plan = plan.json()
        assert (plan["rows_before"], plan["rows_new"]) == (27, 9)
        assert (plan["trials_existing"], plan["trials_new"]) == (15, 6)
        new_uniform = [r for r in plan["plan"]["rows"] if r["new"] and r["loss_stack"] == "uniform"]
        assert len(new_uniform) == 3
        assert all(plan["plan"]["trials"][r["trial"]]["exists"] for r in new_uniform)
        # Nothing changed: the sweep has no extension, the same spec and trial count.
        sweep = client.get(f"/sweeps/{sweep_id}").json()
        assert sweep["counters"]["total"] == 15
        assert client.get(f"/sweeps/{sweep_id}/extensions").json() == []


def test_an_extension_is_recorded_and_replayed_by_its_key(paused_service):
    with paused_service.client() as client:
        sweep_id = _submit(client, name="grow-key")
        headers = auth("alice") | {"Idempotency-Key": "more-seeds"}
        first = client.post(f"/sweeps/{sweep_id}/extend", json={"seeds": [3, 4]}, headers=headers)
        assert first.status_code == 201, first.text
        body = first.json()
        assert body["sweep"]["state"] == "queued" and body["sweep"]["counters"]["total"] == 25
        record = body["extension"]
        assert record["number"] == 1 and record["added"] == {"seeds": [3, 4]}
        assert record["trials"] == {"before": 15, "after": 25, "new": 10}
        assert record["after_report"] is None and record["state_before"] == "queued"
        assert "has not started" in body["when"] and "idempotency_key" not in record
        again = client.post(f"/sweeps/{sweep_id}/extend", json={"seeds": [3, 4]}, headers=headers)
        assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["extension"]["number"] == 1
        other = client.post(f"/sweeps/{sweep_id}/extend", json={"seeds": [5]}, headers=headers)
        assert _problem(other, 409)["type"].endswith("/idempotency-conflict")
        listed = client.get(f"/sweeps/{sweep_id}/extensions").json()
        assert [e["number"] for e in listed] == [1] and listed[0]["added"] == {"seeds": [3, 4]}
        # The stored spec is the union: a second extension builds on it.
        second = client.post(f"/sweeps/{sweep_id}/extend", json={"alpha": [0.5]},
                             headers=auth("admin"))
        assert second.status_code == 201, second.text
        assert second.json()["extension"]["trials"] == {"before": 25, "after": 35, "new": 10}


def test_refusals_name_their_field(paused_service):
    with paused_service.client() as client:
        sweep_id = _submit(client, name="grow-refused")
        extend = f"/sweeps/{sweep_id}/extend"
        assert _problem(client.post(extend, json={"seeds": [3]}), 401)
        assert _problem(client.post(extend, json={"seeds": [3]}, headers=auth("bob")), 403)
        assert "template.training.epochs" in _fields(client.post(
            extend, json={"seeds": [3], "template": {"training": {"epochs": 20}}},
            headers=auth("alice")))
        assert "beta" in _fields(client.post(extend, json={"beta": [2]}, headers=auth("alice")))
        assert "seeds.0" in _fields(client.post(extend, json={"seeds": ["3"]}, headers=auth("alice")))
        # Past the service's cap of 100 trials per sweep: 15 + 95 seeds' worth.
        capped = _fields(client.post(extend, json={"seeds": list(range(3, 40))},
                                     headers=auth("alice")))
        assert "budget.max_trials" in capped
        optuna = _submit(client, name="grow-optuna", alpha={"low": 0, "high": 2}, seeds=1,
                         search={"kind": "optuna"})
        assert "search.kind" in _fields(client.post(f"/sweeps/{optuna}/extend", json={"seeds": [3]},
                                                    headers=auth("alice")))
        asha = _submit(client, name="grow-asha", scheduler={"kind": "asha"},
                       resources={"cohort_size": 1})
        assert "scheduler.kind" in _fields(client.post(f"/sweeps/{asha}/extend", json={"seeds": [3]},
                                                       headers=auth("alice")))
        random = _submit(client, name="grow-random", alpha={"low": 0, "high": 2},
                         search={"kind": "random", "num_samples": 2})
        assert "alpha" in _fields(client.post(f"/sweeps/{random}/extend", json={"alpha": [0.5]},
                                              headers=auth("alice")))
        assert client.post(f"/sweeps/{random}/extend", json={"seeds": [3]},
                           headers=auth("alice")).status_code == 201
        assert client.post(f"/sweeps/{sweep_id}/cancel", headers=auth("alice")).status_code == 200
        cancelled = client.post(extend, json={"seeds": [3]}, headers=auth("alice"))
        assert "allow_cancelled" in _fields(cancelled, 409)
        asked = client.post(extend, json={"seeds": [3], "allow_cancelled": True},
                            headers=auth("alice"))
        assert asked.status_code == 201 and asked.json()["sweep"]["state"] == "queued"
        assert "had cancelled" in asked.json()["when"]
        assert _problem(client.post("/sweeps/nosuch/extend", json={"seeds": [3]},
                                    headers=auth("alice")), 404)


def test_the_python_client_and_the_cli(paused_service):
    env = {**os.environ, "KSWEEP_URL": paused_service.url.removesuffix("/api/v1"),
           "KSWEEP_TOKEN": TOKENS["alice"], "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    with Client(env["KSWEEP_URL"], TOKENS["alice"]) as client:
        sweep_id = client.submit(spec_dict(name="grow-client")).id
        plan = client.validate_extension(sweep_id, seeds=[3, 4])
        assert (plan.trials_existing, plan.trials_new) == (15, 10)
        try:
            client.extend(sweep_id, beta=[2.0])
            raise AssertionError("beta on a sweep that does not sweep it was accepted")
        except InvalidRequest as error:
            assert error.problem.errors[0].field == "beta"
        with Client(env["KSWEEP_URL"], TOKENS["bob"]) as bob:
            try:
                bob.extend(sweep_id, seeds=[3])
                raise AssertionError("another owner extended the sweep")
            except Forbidden:
                pass
        try:
            client.compare([sweep_id, client.submit(spec_dict(name="grow-other")).id])
            raise AssertionError("sweeps without reports were compared")
        except Conflict as error:
            assert error.problem.type.endswith("/report-not-ready")

    def ksweep(*args):
        return subprocess.run([sys.executable, "-m", "ksweep.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    dry = ksweep("extend", sweep_id, "--seeds", "3-4", "--alpha", "0.5", "--validate")  # a range
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "trials 15 already run or planned, 20 new (only these run)" in " ".join(
        dry.stdout.split())
    assert max(len(line) for line in dry.stdout.splitlines()) <= 80
    done = ksweep("extend", sweep_id, "--seeds", "3,4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "extension 1 adds seeds 3, 4; 10 new trial(s), 25 in all; now queued" in " ".join(
        done.stdout.split())
    refused = ksweep("extend", sweep_id, "--seeds", "x")
    assert refused.returncode == 2 and "--seeds" in refused.stdout
    backwards = ksweep("extend", sweep_id, "--seeds", "9-5")
    assert backwards.returncode == 2 and "ranges a-b" in " ".join(backwards.stdout.split())
    bad = ksweep("extend", sweep_id, "--loss-stacks", "nosuchpreset")
    assert bad.returncode == 2 and "loss_stacks" in bad.stdout

"""``/api/v1/sweeps``: submit, list, inspect, cancel, report, and dry-run validate."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Response
from pydantic import BaseModel
from sqlalchemy import Row

from service.api import documents
from service.api.bodies import list_page_body, sweep_body
from service.api.deps import OwnerDep, ReaderDep, Services, ServicesDep, may_act_on
from service.api.errors import ProblemError, invalid_spec
from service.api.schemas import (
    PROBLEM_MEDIA_TYPE,
    FieldProblem,
    Problem,
    Report,
    Sweep,
    SweepPage,
    SweepStateValue,
    Trial,
    TrialPage,
    TrialStateValue,
)
from service.api.spec_checks import check_spec_dataset, check_spec_model
from service.api.strict_body import StrictRoute, strict_body
from service.lifecycle import ACTIVE_SWEEP_STATES
from service.store.db import SweepRow
from service.store.queries import IdempotencyConflict
from sweeps.plan.budget import build_plan_within_budget
from sweeps.plan.build import SweepPlan
from sweeps.spec import SweepSpec, load_sweep_spec
from sweeps.status import SweepState
from workers.datasets.train_facts import TrainFacts, train_facts

# Spec bodies are parsed strictly (service.api.strict_body); `_schema` only documents them.
router = APIRouter(tags=["sweeps"], route_class=StrictRoute)
StrictSpec = Annotated[SweepSpec, Depends(strict_body(SweepSpec))]

SweepId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="The sweep's id.")]


def _problem(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description,
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


UNAUTHORIZED = {401: _problem("No valid bearer token.")}
NOT_FOUND = {404: _problem("No sweep with that id.")}
INVALID = {422: _problem("Invalid spec or parameters, with every offending field path.")}
TOO_LARGE = {413: _problem("The request body exceeds KSWEEP_MAX_BODY_BYTES."),
             400: _problem("The request body could not be parsed (not UTF-8 JSON).")}


def _quickstart_example() -> dict[str, Any]:
    from pathlib import Path as FilePath

    path = FilePath(__file__).resolve().parents[2] / "sweeps" / "examples" / "quickstart.yaml"
    try:
        return load_sweep_spec(path).model_dump(mode="json", exclude_defaults=True)
    except (OSError, ValueError):
        return {"name": "quickstart", "alpha": [0, 1, 2], "loss_stacks": ["uniform", "raw_plus_ncc"]}


SPEC_EXAMPLES = {
    "quickstart": {"summary": "alpha {0,1,2} x {uniform, raw_plus_ncc}, one seed",
                   "value": _quickstart_example()},
}
SpecBody = Annotated[SweepSpec, Body(openapi_examples=SPEC_EXAMPLES)]


def _sweep(row: SweepRow | Row, services: Services) -> Sweep:
    return documents.sweep_resource(row, services.settings.mlflow_ui_url)


# Every endpoint that touches the store is a sync `def`: FastAPI runs it in its thread pool, so
# no SQL statement (sync SQLAlchemy) ever blocks the event loop. The hot reads and the submission
# return their JSON bytes themselves (pydantic's serializer, in the pool thread): a returned model
# would be validated against `response_model` once more and serialised through
# `jsonable_encoder`, which cost more CPU than the rest of the request together.
def _body(model: BaseModel) -> bytes:
    return model.__pydantic_serializer__.to_json(model)


def _json(model: BaseModel, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_body(model), status_code=status_code, headers=headers,
                    media_type="application/json")


def _get_row(services: Services, sweep_id: str, *, with_documents: bool = False) -> SweepRow | Row:
    """The sweep or 404; its spec and report are loaded only ``with_documents``."""
    store = services.store
    row = store.get_sweep(sweep_id) if with_documents else store.get_sweep_summary(sweep_id)
    if row is None:
        raise _not_found(sweep_id)
    return row


def _not_found(sweep_id: str) -> ProblemError:
    return ProblemError(404, "Sweep not found", f"no sweep with id {sweep_id!r}", kind="not-found")


def _checked_plan(spec: SweepSpec, services: Services, facts: TrainFacts | None = None) -> SweepPlan:
    """The spec's plan, built once; 422 over ``budget.max_trials`` (a ``ValidationError``
    located there, answered by the app's handler) or over the service's cap."""
    plan = build_plan_within_budget(spec, facts)
    cap = services.settings.max_trials_per_sweep
    count = plan.trial_count
    if count > cap:
        raise invalid_spec([FieldProblem(
            field="budget.max_trials",
            message=f"the sweep expands to {count} trials; this service accepts at most {cap} "
                    "per sweep (KSWEEP_MAX_TRIALS_PER_SWEEP): use fewer alphas, stacks, models "
                    "or seeds, or a smaller search.num_samples")])
    return plan


@router.post(
    "/sweeps", status_code=201, response_model=Sweep,
    summary="Submit a sweep (returns at once; the sweep is queued)",
    responses={200: {"model": Sweep, "description": "Replay of an earlier request with the same "
                                                    "Idempotency-Key and body."},
               **UNAUTHORIZED, **INVALID, **TOO_LARGE,
               409: _problem("The Idempotency-Key was used with a different body."),
               429: _problem("The owner has KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER sweeps queued or "
                             "running; retry after Retry-After seconds.")},
)
def submit_sweep(
    _schema: SpecBody, owner: OwnerDep, spec: StrictSpec,
    services: ServicesDep,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", max_length=200, pattern=r"^[\x21-\x7e]{1,200}$",
        description="Same key and body: the same sweep again; same key, other body: 409.")] = None,
) -> Response:
    trials = _checked_plan(spec, services).trial_count
    canonical = spec.canonical_json()
    parsed = json.loads(canonical)
    check_spec_dataset(parsed, owner, services)
    check_spec_model(parsed, services)
    request_hash = hashlib.sha256(canonical.encode()).hexdigest()
    store = services.store
    if idempotency_key is not None:
        earlier = store.find_by_idempotency_key(owner, idempotency_key)
        if earlier is not None:
            if earlier.request_hash != request_hash:
                raise ProblemError(
                    409, "Idempotency-Key reused with a different body",
                    f"key {idempotency_key!r} already created sweep {earlier.id} from another "
                    "spec; use a new key for a new sweep", kind="idempotency-conflict",
                    sweep_id=earlier.id)
            return _json(_sweep(earlier, services), 200, {"Idempotent-Replayed": "true"})
    cap = services.settings.max_active_sweeps_per_owner
    if store.count_active(owner) >= cap:
        raise ProblemError(
            429, "Too many active sweeps",
            f"owner {owner!r} already has {cap} sweeps queued or running "
            "(KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER); wait for one to finish or cancel one",
            kind="too-many-sweeps", headers={"Retry-After": "30"})
    try:
        row, created = store.create_sweep(
            sweep_id=uuid.uuid4().hex[:12], owner=owner, name=spec.name,
            spec=json.loads(canonical), request_hash=request_hash,
            idempotency_key=idempotency_key, total=trials)
    except IdempotencyConflict as conflict:
        raise ProblemError(409, "Idempotency-Key reused with a different body",
                           kind="idempotency-conflict", sweep_id=conflict.sweep_id) from None
    headers = {"Location": f"/api/v1/sweeps/{row.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return _json(_sweep(row, services), 201 if created else 200, headers)


PILOT = Query(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="A pilot sweep's id: the plan's "
              "`power` gives each planned primary contrast's paired SD from the pilot's report, "
              "the effect the spec's seeds detect at 80% power and the seeds "
              "`analysis.min_effect` needs.")


@router.post("/sweeps:validate", response_model=SweepPlan, summary="Dry run: the trial plan of a spec",
             responses={**UNAUTHORIZED, **INVALID, **TOO_LARGE,
                        404: _problem("The pilot sweep does not exist."),
                        409: _problem("The pilot sweep has no report yet.")})
def validate_sweep(_schema: SpecBody, _reader: ReaderDep,
                   spec: StrictSpec, services: ServicesDep,
                   pilot: Annotated[str | None, PILOT] = None) -> SweepPlan:
    # A dataset's train split from its registry summary (the API reads no table).
    facts = train_facts(spec.template.data, services.settings.dataset_root, read_table=False)
    plan = _checked_plan(spec, services, facts)
    if pilot is not None:
        plan.power = _pilot_power(spec, pilot, services)
    return plan


def _pilot_power(spec: SweepSpec, pilot: str, services: Services) -> dict[str, Any]:
    """The spec's power from the pilot's report; 404 / 409 / 422 (field ``pilot``) otherwise."""
    from sweeps.report.power_plan import PilotMismatch, pilot_power

    row = _get_row(services, pilot, with_documents=True)
    if row.report is None:
        raise ProblemError(409, "Report not available", f"the pilot sweep {pilot} is {row.state} "
                           "and has no report yet; give an ended sweep", kind="report-not-ready",
                           sweep_id=pilot)
    try:
        return pilot_power(spec, row.report)
    except PilotMismatch as error:
        raise invalid_spec([FieldProblem(field="pilot", message=str(error))]) from None


@router.get("/sweeps", response_model=SweepPage, summary="List sweeps, newest first",
            responses={**UNAUTHORIZED, **INVALID})
def list_sweeps(
    _reader: ReaderDep, services: ServicesDep,
    state: Annotated[SweepStateValue | None, Query(description="Only sweeps in this state.")] = None,
    owner: Annotated[str | None, Query(max_length=100, description="Only this owner's.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> Response:
    return Response(list_page_body(services, state, owner, limit, offset),
                    media_type="application/json")


@router.get("/sweeps/{sweep_id}", response_model=Sweep, summary="A sweep: state, counters, ETA",
            responses={**UNAUTHORIZED, **NOT_FOUND, **INVALID})
def get_sweep(sweep_id: SweepId, _reader: ReaderDep,
              services: ServicesDep) -> Response:
    body = sweep_body(services, sweep_id)
    if body is None:
        raise _not_found(sweep_id)
    return Response(body, media_type="application/json")


@router.get("/sweeps/{sweep_id}/trials", response_model=TrialPage,
            summary="The sweep's trials: config, state, latest metrics",
            responses={**UNAUTHORIZED, **NOT_FOUND, **INVALID})
def list_trials(
    sweep_id: SweepId, _reader: ReaderDep, services: ServicesDep,
    state: Annotated[TrialStateValue | None, Query(description="Only trials in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> TrialPage:
    _get_row(services, sweep_id)
    page = services.store.list_trials(sweep_id, state=state, limit=limit, offset=offset)
    items = [Trial(trial_id=t.trial_id, state=t.state, config=t.config, metrics=t.metrics,
                   epochs=t.epochs, mlflow_run_id=t.mlflow_run_id, error=t.error,
                   updated_at=t.updated_at) for t in page.items]
    return TrialPage(items=items, total=page.total, limit=limit, offset=offset)


@router.get("/sweeps/{sweep_id}/report", response_model=Report,
            summary="The sweep's report: alpha x loss_stack x model with 95% intervals",
            responses={**UNAUTHORIZED, **NOT_FOUND, **INVALID,
                       409: _problem("The sweep has no report (yet): it is still queued or "
                                     "running, or was cancelled before its end.")})
def get_report(sweep_id: SweepId, _reader: ReaderDep,
               services: ServicesDep) -> dict[str, Any]:
    row = _get_row(services, sweep_id, with_documents=True)
    if row.report is None:
        why = ("it was cancelled before its report was written" if row.state == SweepState.CANCELLED
               else f"it is {row.state}; the report is written when it ends")
        raise ProblemError(409, "Report not available", f"sweep {sweep_id} has no report: {why}",
                           kind="report-not-ready", sweep_id=sweep_id)
    return row.report


def _cancel(sweep_id: str, owner: str, services: Services) -> Sweep:
    row = _get_row(services, sweep_id)
    if not may_act_on(owner, row.owner):
        raise ProblemError(403, "Forbidden", f"sweep {sweep_id} belongs to {row.owner!r}; only its "
                           "owner or an admin token may cancel it", kind="forbidden")
    if row.state in ACTIVE_SWEEP_STATES:
        services.supervisor.cancel(row)
    return _sweep(_get_row(services, sweep_id), services)


CANCEL = {"response_model": Sweep,
          "responses": {**UNAUTHORIZED, **NOT_FOUND, **INVALID,
                        403: _problem("The sweep belongs to another owner.")}}


@router.post("/sweeps/{sweep_id}/cancel", summary="Cancel a sweep (idempotent)", **CANCEL)
def cancel_sweep(sweep_id: SweepId, owner: OwnerDep,
                 services: ServicesDep) -> Sweep:
    """Stops the driver and its trials; finished trials keep their MLflow runs. Cancelling an
    ended sweep changes nothing and returns it as it is."""
    return _cancel(sweep_id, owner, services)

"""Sweeps that grow and sweeps compared: ``/sweeps/{id}/extend``, its dry run, the
extensions list, and ``/sweeps:compare``.

An extension adds values to a sweep's axes (:mod:`sweeps.plan.growth`); the stored spec
becomes the union and the extension is recorded with what it added and after which report.
A sweep that had ended is queued again; a queued or running one takes the extension as it
is (its driver runs the new trials once the ones it runs have ended). Only the owner (or an
admin) may extend a sweep; an ``Idempotency-Key`` makes a retried request safe.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Response

from service.api.deps import OwnerDep, ReaderDep, Services, ServicesDep, may_act_on
from service.api.errors import ProblemError, invalid_spec
from service.api.routes.shared import (
    FORBIDDEN,
    INVALID,
    NOT_FOUND,
    TOO_LARGE,
    UNAUTHORIZED,
    SweepId,
    get_row,
    model_json,
    problem,
    sweep_document,
)
from service.api.schemas import (
    Extension,
    ExtensionPlan,
    ExtensionResult,
    FieldProblem,
    Report,
)
from service.api.strict_body import StrictRoute, strict_body
from service.lifecycle import ACTIVE_SWEEP_STATES
from sweeps.plan.growth import ExtensionRequest, MarkedPlan, extend_spec, extension_plan
from sweeps.spec import SweepSpec
from sweeps.status import SweepState

if TYPE_CHECKING:  # the store's tables load with the store (the app's lifespan), not at import
    from service.store.db import SweepRow

router = APIRouter(tags=["sweeps"], route_class=StrictRoute)
StrictExtension = Annotated[ExtensionRequest, Depends(strict_body(ExtensionRequest))]
IDEMPOTENCY_KEY = Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x21-\x7e]{1,200}$",
                         description="Same key and body: the same extension again; same key, "
                                     "other body: 409.")
MAX_COMPARED = 8


def _planned(row: SweepRow, request: ExtensionRequest, services: Services
             ) -> tuple[SweepSpec, MarkedPlan]:
    """The union spec and its marked plan; 422 naming the field for every refusal."""
    extended = extend_spec(SweepSpec.model_validate(row.spec), request)
    marked = extension_plan(SweepSpec.model_validate(row.spec), extended)
    cap = services.settings.max_trials_per_sweep
    if marked.plan.trial_count > cap:
        raise invalid_spec([FieldProblem(
            field="budget.max_trials",
            message=f"the extended sweep has {marked.plan.trial_count} trials; this service "
                    f"accepts at most {cap} per sweep (KSWEEP_MAX_TRIALS_PER_SWEEP)")])
    return extended, marked


_PRIVATE = ("idempotency_key", "request_hash", "plan")  # kept for replays, never shown


def _public(record: dict[str, Any]) -> Extension:
    return Extension.model_validate({k: v for k, v in record.items() if k not in _PRIVATE})


def _plan_body(marked: MarkedPlan) -> ExtensionPlan:
    return ExtensionPlan.model_validate(marked.to_dict())


def _request_hash(request: ExtensionRequest) -> str:
    body = request.model_dump(mode="json")
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _after_report(row: SweepRow) -> dict[str, Any] | None:
    if row.report is None:
        return None
    from sweeps.report.text import headline

    return {"number": len(row.report.get("extensions") or []) + 1,
            "headline": headline(row.report)[:500]}


def _when(state: str, new_trials: int) -> str:
    if state == SweepState.RUNNING:
        return (f"the sweep is running: its current trials go on, and the {new_trials} new "
                "trial(s) run after them as a further Tune experiment under the same parent run "
                "(a running experiment's trials are fixed); the report covers the union")
    if state == SweepState.QUEUED:
        return (f"the sweep has not started: its first run trains the extended plan "
                f"({new_trials} trial(s) added)")
    return (f"the sweep had {state}: it is queued again, runs the {new_trials} new trial(s) "
            "under the same parent run, and its report is rebuilt over the union when they end")


def _replayed(row: SweepRow, key: str, request_hash: str, services: Services) -> Response | None:
    for record in row.extensions or []:
        if record.get("idempotency_key") != key:
            continue
        if record.get("request_hash") != request_hash:
            raise ProblemError(409, "Idempotency-Key reused with a different body",
                               f"key {key!r} already extended sweep {row.id} with other values; "
                               "use a new key for a new extension", kind="idempotency-conflict",
                               sweep_id=row.id)
        result = ExtensionResult(sweep=sweep_document(get_row(services, row.id), services),
                                 extension=_public(record),
                                 when="this extension was accepted before (replayed)",
                                 plan=ExtensionPlan.model_validate(record["plan"]))
        return model_json(result, 200, {"Idempotent-Replayed": "true"})
    return None


def _check_state(row: SweepRow, request: ExtensionRequest, services: Services) -> None:
    if row.state == SweepState.CANCELLED and not request.allow_cancelled:
        message = (f"sweep {row.id} was cancelled; extend it only on purpose: allow_cancelled: "
                   "true (ksweep extend --cancelled)")
        raise ProblemError(409, "Sweep cancelled", message, kind="sweep-cancelled",
                           errors=[FieldProblem(field="allow_cancelled", message=message)],
                           sweep_id=row.id)
    cap = services.settings.max_active_sweeps_per_owner
    if row.state not in ACTIVE_SWEEP_STATES and services.store.count_active(row.owner) >= cap:
        raise ProblemError(
            429, "Too many active sweeps",
            f"owner {row.owner!r} already has {cap} sweeps queued or running "
            "(KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER); the extended sweep would run again",
            kind="too-many-sweeps", headers={"Retry-After": "30"})


@router.post(
    "/sweeps/{sweep_id}/extend", status_code=201, response_model=ExtensionResult,
    summary="Extend a sweep: more seeds, alphas, stacks or models; only new trials run",
    responses={200: {"model": ExtensionResult, "description": "Replay of an earlier request "
                                                              "with the same Idempotency-Key."},
               **UNAUTHORIZED, **NOT_FOUND, **INVALID, **TOO_LARGE, **FORBIDDEN,
               409: problem("The sweep was cancelled (allow_cancelled), changed meanwhile, or "
                             "the Idempotency-Key was used with another body."),
               429: problem("The owner has KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER sweeps active.")},
)
def extend_sweep(
    sweep_id: SweepId, _schema: ExtensionRequest, owner: OwnerDep, request: StrictExtension,
    services: ServicesDep, idempotency_key: Annotated[str | None, IDEMPOTENCY_KEY] = None,
) -> Response:
    """The axes become the Cartesian product of the unions (old values first); trials the
    sweep already has are not run again (matched by objective, model and seed, so a new alpha
    adds no `uniform` trial). Refused, naming the field: Optuna or ASHA sweeps, a random
    sweep's axes but seeds, a non-swept setting, a cancelled sweep without allow_cancelled, a
    union over budget.max_trials."""
    row = get_row(services, sweep_id, with_documents=True)
    if not may_act_on(owner, row.owner):
        raise ProblemError(403, "Forbidden", f"sweep {sweep_id} belongs to {row.owner!r}; only "
                           "its owner or an admin token may extend it", kind="forbidden")
    request_hash = _request_hash(request)
    if idempotency_key is not None:
        replay = _replayed(row, idempotency_key, request_hash, services)
        if replay is not None:
            return replay
    _check_state(row, request, services)
    extended, marked = _planned(row, request, services)
    plan = _plan_body(marked)
    record = {
        "number": row.extension_count + 1, "added": marked.added, "primary": request.primary,
        "after_report": _after_report(row), "state_before": row.state,
        "requested_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": {"before": marked.rows_before, "after": len(marked.plan.rows)},
        "trials": {"before": marked.trials_before, "after": marked.plan.trial_count,
                   "new": marked.trials_new},
        "idempotency_key": idempotency_key, "request_hash": request_hash,
        "plan": plan.model_dump(mode="json", exclude={"plan"}),
    }
    if not services.store.extend_sweep(
            sweep_id, expected_count=row.extension_count,
            spec=json.loads(extended.canonical_json()), record=record,
            total=marked.plan.trial_count,
            from_states=(*ACTIVE_SWEEP_STATES, SweepState.SUCCEEDED.value, SweepState.FAILED.value,
                         SweepState.CANCELLED.value)):
        raise ProblemError(409, "Sweep changed", f"sweep {sweep_id} changed while it was being "
                           "extended (another extension or its end); read it and try again",
                           kind="extension-conflict", sweep_id=sweep_id)
    result = ExtensionResult(sweep=sweep_document(get_row(services, sweep_id), services),
                             extension=_public(record),
                             when=_when(row.state, marked.trials_new), plan=plan)
    return model_json(result, 201, {"Location": f"/api/v1/sweeps/{sweep_id}/extensions"})


@router.post("/sweeps/{sweep_id}/extend:validate", response_model=ExtensionPlan,
             summary="Dry run of an extension: which rows are new, which trials already exist",
             responses={**UNAUTHORIZED, **NOT_FOUND, **INVALID, **TOO_LARGE})
def validate_extension(
    sweep_id: SweepId, _schema: ExtensionRequest, _reader: ReaderDep, request: StrictExtension,
    services: ServicesDep,
) -> ExtensionPlan:
    """Runs nothing and changes nothing; refuses what ``/extend`` would refuse (but a
    cancelled sweep's state, which only ``/extend`` checks)."""
    row = get_row(services, sweep_id, with_documents=True)
    return _plan_body(_planned(row, request, services)[1])


@router.get("/sweeps/{sweep_id}/extensions", response_model=list[Extension],
            summary="A sweep's extensions, oldest first",
            responses={**UNAUTHORIZED, **NOT_FOUND, **INVALID})
def list_extensions(sweep_id: SweepId, _reader: ReaderDep,
                    services: ServicesDep) -> list[Extension]:
    row = get_row(services, sweep_id, with_documents=True)
    return [_public(record) for record in row.extensions or []]


@router.get("/sweeps:compare", response_model=Report,
            summary="One report over several compatible sweeps, paired by seed",
            responses={**UNAUTHORIZED, **NOT_FOUND, **INVALID,
                       409: problem("A sweep has no report yet, or the sweeps are not "
                                     "compatible (every differing field named)."),
                       503: problem("The MLflow tracking store could not be read.")})
def compare_sweeps(
    ids: Annotated[list[str], Query(description="Sweep ids, comma-separated or repeated (2 to "
                                                f"{MAX_COMPARED}).", examples=["a1b2c3,d4e5f6"])],
    _reader: ReaderDep, services: ServicesDep,
) -> dict[str, Any]:
    """Sweeps whose specs agree on everything but the swept axes (and bookkeeping: name,
    tags, budget, resources, reuse); their trials are read from MLflow."""
    from service.api.comparison import compare

    sweep_ids = list(dict.fromkeys(i.strip() for value in ids for i in value.split(",") if i.strip()))
    if not 2 <= len(sweep_ids) <= MAX_COMPARED:
        message = f"give 2 to {MAX_COMPARED} distinct sweep ids, got {len(sweep_ids)}"
        raise ProblemError(422, "Invalid request", f"ids: {message}", kind="invalid-request",
                           errors=[FieldProblem(field="ids", message=message)])
    rows = [get_row(services, sweep_id, with_documents=True) for sweep_id in sweep_ids]
    return compare(rows, services.settings.mlflow_tracking_uri)

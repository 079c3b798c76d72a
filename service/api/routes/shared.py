"""What the route modules share: the sweep id's path parameter, the problem responses their
OpenAPI entries list, a sweep's row or 404, and a model returned as its JSON bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Path, Response
from pydantic import BaseModel

from service.api import documents
from service.api.deps import Services
from service.api.errors import ProblemError
from service.api.schemas import PROBLEM_MEDIA_TYPE, Problem, Sweep

if TYPE_CHECKING:  # the store's tables load with the store (the app's lifespan), not at import
    from sqlalchemy import Row

    from service.store.db import SweepRow

SweepId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="The sweep's id.")]


def problem(description: str) -> dict[str, Any]:
    """An OpenAPI ``responses`` entry: a problem details body (RFC 9457) and what it means."""
    return {"model": Problem, "description": description,
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


UNAUTHORIZED = {401: problem("No valid bearer token.")}
NOT_FOUND = {404: problem("No sweep with that id.")}
INVALID = {422: problem("Invalid spec or parameters, with every offending field path.")}
TOO_LARGE = {413: problem("The request body exceeds KSWEEP_MAX_BODY_BYTES."),
             400: problem("The request body could not be parsed (not UTF-8 JSON).")}
FORBIDDEN = {403: problem("The sweep belongs to another owner.")}


# The hot reads and the submission return their JSON bytes themselves (pydantic's serializer,
# in the pool thread): a returned model would be validated against `response_model` once more
# and serialised through `jsonable_encoder`, which cost more CPU than the rest of the request.
def model_json(model: BaseModel, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``model`` as an ``application/json`` response, serialised once."""
    return Response(model.__pydantic_serializer__.to_json(model), status_code=status_code,
                    headers=headers, media_type="application/json")


def sweep_not_found(sweep_id: str) -> ProblemError:
    """The 404 of a sweep id no sweep has."""
    return ProblemError(404, "Sweep not found", f"no sweep with id {sweep_id!r}", kind="not-found")


def get_row(services: Services, sweep_id: str, *, with_documents: bool = False) -> SweepRow | Row:
    """The sweep or 404; its spec and report are loaded only ``with_documents``."""
    store = services.store
    row = store.get_sweep(sweep_id) if with_documents else store.get_sweep_summary(sweep_id)
    if row is None:
        raise sweep_not_found(sweep_id)
    return row


def sweep_document(row: SweepRow | Row, services: Services) -> Sweep:
    """The sweep resource of a store row, its links on this service's MLflow UI."""
    return documents.sweep_resource(row, services.settings.mlflow_ui_url)

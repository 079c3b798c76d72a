"""``/api/v1/datasets``: register (streamed raw upload), list, show and remove datasets.

The registry is :class:`workers.datasets.store.DatasetStore` under ``KSWEEP_DATA_ROOT``.
Uploads go through :mod:`service.api.dataset_upload` (size caps, a validation subprocess under a
memory limit); this module maps the store's answers to HTTP and checks who may do what.
"""

from __future__ import annotations

import json
from pathlib import PurePath
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.dataset_upload import (
    check_tokenizer_model,
    dataset_problem,
    receive_upload,
    temp_upload_path,
    upload_format,
    validate_in_child,
)
from service.api.deps import OwnerDep, ReaderDep, ServicesDep, may_act_on
from service.api.errors import ProblemError
from service.api.schemas import PROBLEM_MEDIA_TYPE, Problem
from service.api.spec_checks import spec_dataset
from service.lifecycle import ACTIVE_SWEEP_STATES
from workers.contract import REGISTERED_NAME_PATTERN
from workers.data.config import DATASET_NAME_PATTERN
from workers.datasets.formats import FORMATS, Format
from workers.datasets.limits import DatasetError
from workers.datasets.store import (
    DatasetConflict,
    DatasetNotFound,
    DatasetQuotaExceeded,
    DatasetRecord,
    DatasetStore,
)

router = APIRouter(tags=["datasets"])
DatasetName = Annotated[str, Path(pattern=DATASET_NAME_PATTERN, description="The dataset's name.")]


def _problem(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description,
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


INVALID_NAME = {422: _problem("Not a dataset name (invalid-dataset), or invalid parameters.")}


def _json(body: Any, status_code: int = 200) -> Response:
    return Response(json.dumps(body), status_code=status_code, media_type="application/json")


def _checked_name(name: str) -> str:
    try:
        return DatasetStore.check_name(name)
    except DatasetError as err:
        raise dataset_problem(err) from None


def _not_found(name: str) -> ProblemError:
    return ProblemError(404, "Dataset not found", f"no dataset named {name!r}; GET "
                        "/api/v1/datasets lists them", kind="dataset-not-found")


@router.post(
    "/datasets", status_code=201, response_model=DatasetRecord,
    summary="Register a dataset: ONE Parquet, Arrow IPC or JSONL file as the raw request body",
    responses={200: {"model": DatasetRecord, "description": "The name already holds this content."},
               400: _problem("The client went away during the upload."),
               401: _problem("No valid bearer token."),
               409: _problem("The name holds other content (add replace=true)."),
               413: _problem("Over KSWEEP_MAX_DATASET_BYTES, or the owner's dataset quota."),
               415: _problem("Multipart, an archive, or a format the Content-Type does not name."),
               422: _problem("An invalid dataset: the file, column, first offending row and fix "
                             "(column `tokenizer`: an unknown model, or no text to tokenize).")},
    openapi_extra={"requestBody": {"required": True, "content": {
        media: {"schema": {"type": "string", "format": "binary"}} for media in (
            *(fmt.media_types[0] for fmt in FORMATS), "application/octet-stream")}}},
)
async def add_dataset(
    request: Request, owner: OwnerDep, services: ServicesDep,
    name: Annotated[str, Query(pattern=DATASET_NAME_PATTERN, description="The dataset's name.")],
    replace: Annotated[bool, Query(description="Point an existing name at new content.")] = False,
    format: Annotated[Format | None, Query(
        description="The file's format, when the Content-Type does not say.")] = None,
    filename: Annotated[str | None, Query(max_length=200, description="The file's name, for "
                                          "error messages (default NAME.FORMAT).")] = None,
    tokenizer: Annotated[str | None, Query(
        pattern=f"^{REGISTERED_NAME_PATTERN}$", description="Tokenize the text (x_text / y_text) "
        "with this registered model's tokenizer (`ksweep model add`, on the service's "
        "KSWEEP_MODEL_ROOT) instead of bytes; refused for a file without text.")] = None,
) -> Response:
    settings = services.settings
    _checked_name(name)
    # Only the file's printable base name is ever cited (no NUL or control characters in argv).
    cited = "".join(c for c in PurePath(filename).name if c.isprintable()) if filename else ""
    fmt = upload_format(request.headers.get("content-type"), format, cited or name)
    file = cited or f"{name}.{fmt}"
    if tokenizer is not None:
        check_tokenizer_model(settings, tokenizer)
    store = services.datasets
    held = await run_in_threadpool(store.owner_bytes, owner)
    if held >= settings.dataset_quota_bytes:
        raise ProblemError(413, "Dataset quota exceeded", f"owner {owner!r} holds {held} bytes of "
                           f"datasets, the quota (KSWEEP_DATASET_QUOTA_BYTES) is "
                           f"{settings.dataset_quota_bytes}; remove a dataset first",
                           kind="dataset-quota")
    upload = temp_upload_path(settings, fmt)
    try:
        await receive_upload(request, upload, settings.max_dataset_bytes, file)
        staged = await validate_in_child(settings, upload, fmt, file, tokenizer)
    finally:
        upload.unlink(missing_ok=True)
    try:
        record, created = await run_in_threadpool(
            lambda: store.commit(staged, name=name, owner=owner, replace=replace,
                                 quota_bytes=settings.dataset_quota_bytes))
    except DatasetConflict as err:
        raise ProblemError(409, "Dataset name taken", f"{err}; add replace=true (ksweep data "
                           "add --replace)", kind="dataset-conflict") from None
    except DatasetQuotaExceeded as err:
        raise ProblemError(413, "Dataset quota exceeded", str(err), kind="dataset-quota") from None
    return _json(record.model_dump(mode="json"), 201 if created else 200)


@router.get("/datasets", response_model=list[DatasetRecord], summary="Registered datasets, by name",
            responses={422: _problem("Invalid parameters.")})
def list_datasets(_reader: ReaderDep, services: ServicesDep,
                  owner: Annotated[str | None, Query(description="Only this owner's.")] = None,
                  ) -> Response:
    records = [r for r in services.datasets.list() if owner is None or r.owner == owner]
    return _json([r.model_dump(mode="json") for r in records])


@router.get("/datasets/{name}", response_model=DatasetRecord,
            summary="A dataset: owner, content hash, rows, summary",
            responses={404: _problem("No dataset of that name."), **INVALID_NAME})
def get_dataset(name: DatasetName, _reader: ReaderDep,
                services: ServicesDep) -> Response:
    _checked_name(name)
    try:
        return _json(services.datasets.get(name).model_dump(mode="json"))
    except DatasetNotFound:
        raise _not_found(name) from None


@router.delete(
    "/datasets/{name}", response_model=DatasetRecord,
    summary="Remove a dataset name (its content goes when no other name uses it)",
    responses={401: _problem("No valid bearer token."),
               403: _problem("Another owner's dataset (only it or admin may remove it)."),
               404: _problem("No dataset of that name."),
               409: _problem("A queued or running sweep names the dataset."), **INVALID_NAME},
)
def remove_dataset(name: DatasetName, owner: OwnerDep,
                   services: ServicesDep) -> Response:
    _checked_name(name)
    store = services.datasets
    try:
        record = store.get(name)
    except DatasetNotFound:
        raise _not_found(name) from None
    if not may_act_on(owner, record.owner):
        raise ProblemError(403, "Forbidden", f"dataset {name!r} belongs to {record.owner!r}",
                           kind="dataset-forbidden")
    users = [row.id for state in ACTIVE_SWEEP_STATES for row in services.store.sweeps_in_state(state)
             if spec_dataset(row.spec or {}) == name]
    if users:
        raise ProblemError(409, "Dataset in use", f"dataset {name!r} is named by the queued or "
                           f"running sweep(s) {', '.join(users)}; cancel them or wait",
                           kind="dataset-in-use", sweep_id=users[0])
    try:
        removed = store.remove(name)
    except DatasetNotFound:
        raise _not_found(name) from None
    return _json(removed.model_dump(mode="json"))

"""Receiving a dataset upload: the raw body streamed to a temp file, validated in a child process.

Order of the checks (each refusal leaves the registry unchanged): the format (Content-Type or
``format``; multipart and archives refused), ``Content-Length`` against
``KSWEEP_MAX_DATASET_BYTES``, the streamed bytes counted and the upload cut at limit + 1, then
:mod:`workers.datasets.check` in a subprocess under ``RLIMIT_AS`` and a timeout. The service
never parses the file itself; the child stages the canonical table, the route commits it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from service.api.errors import ProblemError
from service.api.schemas import FieldProblem
from service.settings import Settings
from workers.datasets.formats import BY_NAME, MEDIA_FORMATS
from workers.datasets.limits import CHILD_ENV, EXIT_OUT_OF_MEMORY, DatasetError, DatasetLimits
from workers.datasets.store import DatasetStore, StagedDataset

log = logging.getLogger("ksweep.service")
WRITE_CHUNK = 1 << 20
# One validation at a time per API process: each child may use its whole memory limit.
_validations = asyncio.Semaphore(1)


def dataset_problem(err: DatasetError) -> ProblemError:
    """422 naming the file, column, first offending row and the fix."""
    where = err.column or "(file)"
    if err.row is not None:
        where += f"[row {err.row}]"
    return ProblemError(422, "Invalid dataset", str(err), kind="invalid-dataset",
                        errors=[FieldProblem(field=where, message=f"{err.message}. Fix: {err.fix}")])


def upload_format(content_type: str | None, fmt: str | None, file: str) -> str:
    """The upload's format: the ``format`` parameter, else the Content-Type.

    Raises:
        ProblemError: 415 for multipart, archives and unknown types; 422 when both are given
            and disagree.
    """
    media = (content_type or "").split(";")[0].strip().lower()
    if media.startswith("multipart/") or media in (
            "application/zip", "application/gzip", "application/x-tar", "application/x-7z-compressed"):
        raise ProblemError(415, "Unsupported upload", f"{file}: {media} is refused: send ONE "
                           "Parquet, Arrow or JSONL file as the raw body (no multipart, no archive)",
                           kind="unsupported-dataset-media")
    by_media = MEDIA_FORMATS.get(media)
    if fmt is not None and by_media is not None and fmt != by_media:
        raise dataset_problem(DatasetError(
            f"format={fmt} but Content-Type {media} says {by_media}", file=file, column=None,
            row=None, fix="send a matching Content-Type, or application/octet-stream"))
    found = fmt or by_media
    if found is None:
        raise ProblemError(415, "Unsupported upload", f"{file}: cannot tell the format from "
                           f"Content-Type {media or '(none)'!r}; send "
                           "application/vnd.apache.parquet, application/vnd.apache.arrow.file or "
                           "application/x-ndjson, or add ?format=parquet|arrow|jsonl",
                           kind="unsupported-dataset-media")
    return found


def too_large(file: str, limit: int, what: str) -> ProblemError:
    # Connection: close makes the server drop the rest of the body instead of draining it.
    return ProblemError(413, "Dataset too large", f"{file}: {what} exceeds {limit} bytes "
                        "(KSWEEP_MAX_DATASET_BYTES); split the dataset or ask for a larger limit",
                        kind="dataset-too-large", headers={"Connection": "close"})


async def receive_upload(request: Request, target: Path, limit: int, file: str) -> int:
    """Stream the body into ``target``; 413 as soon as it passes ``limit`` bytes.

    Returns:
        The body's size in bytes.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(file, limit, f"Content-Length {declared}")
    size, pending = 0, bytearray()
    with target.open("wb") as handle:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(file, limit, "the body")
                pending += chunk
                if len(pending) >= WRITE_CHUNK:
                    await run_in_threadpool(handle.write, bytes(pending))
                    pending.clear()
        except ClientDisconnect:
            raise ProblemError(400, "Upload interrupted", f"{file}: the client went away after "
                               f"{size} bytes", kind="upload-interrupted") from None
        await run_in_threadpool(handle.write, bytes(pending))
    if size == 0:
        raise dataset_problem(DatasetError("the upload is empty", file=file, column=None, row=None,
                                           fix="send the file as the request body"))
    return size


def limits_of(settings: Settings) -> DatasetLimits:
    return DatasetLimits(max_rows=settings.max_dataset_rows, max_tokens=settings.max_dataset_tokens,
                         max_line_bytes=settings.max_dataset_line_bytes)


async def validate_in_child(settings: Settings, upload: Path, fmt: str, file: str,
                            tokenizer_model: str | None = None) -> StagedDataset:
    """Run :mod:`workers.datasets.check` on ``upload``; the staged table, or a problem.

    ``tokenizer_model``: the text is tokenized by this model of ``KSWEEP_MODEL_ROOT`` (checked
    to be registered before the upload is read: :func:`check_tokenizer_model`).

    Raises:
        ProblemError: 422 for a refused dataset (naming file, column, row, fix), for a child
            that ran out of its memory limit or time (naming the setting to raise).
    """
    memory = settings.dataset_validate_memory_bytes
    staging_id = uuid.uuid4().hex
    args = [sys.executable, "-m", "workers.datasets.check", "--input", str(upload),
            "--format", fmt, "--source-name", file, "--root", str(settings.dataset_root),
            "--limits", limits_of(settings).model_dump_json(), "--memory-bytes", str(memory),
            "--staging-id", staging_id]
    if tokenizer_model is not None:
        args += ["--tokenizer-model", tokenizer_model,
                 "--model-root", str(settings.resolved_model_root)]
    async with _validations:
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, **CHILD_ENV})
        try:
            out, err = await asyncio.wait_for(proc.communicate(),
                                              settings.dataset_validate_timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            DatasetStore(settings.dataset_root).discard_id(staging_id)
            raise dataset_problem(DatasetError(
                f"validation took over {settings.dataset_validate_timeout_s:.0f} s", file=file,
                column=None, row=None, fix="register a smaller file, or raise "
                "KSWEEP_DATASET_VALIDATE_TIMEOUT_S")) from None
    result: dict[str, Any] = {}
    lines = out.decode(errors="replace").strip().splitlines()
    if lines:
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = {}
    if result.get("ok"):
        return StagedDataset.model_validate(result["staged"])
    DatasetStore(settings.dataset_root).discard_id(staging_id)  # what a dying child left
    if "error" in result:
        raise dataset_problem(DatasetError(**{k: result["error"][k] for k in (
            "file", "column", "row", "fix")}, message=result["error"]["message"]))
    log.warning("dataset validation of %s ended with exit %s: %s", file, proc.returncode,
                err.decode(errors="replace")[-2000:])
    why = ("ran out of its memory limit" if proc.returncode == EXIT_OUT_OF_MEMORY or result
           else f"failed (exit {proc.returncode}; likely its memory limit)")
    raise dataset_problem(DatasetError(
        f"validation {why} of {memory} bytes", file=file, column=None, row=None,
        fix="register a smaller file, or raise KSWEEP_DATASET_VALIDATE_MEMORY_BYTES"))


def check_tokenizer_model(settings: Settings, name: str) -> None:
    """Refuse (422, field ``tokenizer``) a model that is not registered in the service's store."""
    from workers.lm.registry import ModelError, ModelStore

    try:
        ModelStore(settings.resolved_model_root).get(name)
    except ModelError as error:
        raise dataset_problem(DatasetError(
            str(error), file=None, column="tokenizer", row=None,
            fix="name a model registered on the service (its KSWEEP_MODEL_ROOT)")) from None


def temp_upload_path(settings: Settings, fmt: str) -> Path:
    folder = settings.dataset_root / "tmp" / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{uuid.uuid4().hex}{BY_NAME[fmt].suffixes[0]}"

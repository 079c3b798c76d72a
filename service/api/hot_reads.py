"""The two hot reads, ``GET /api/v1/sweeps/{id}`` and ``GET /api/v1/sweeps``, served ahead of
FastAPI's per-request layers.

Dashboards and ``ksweep status``/``watch`` poll these far more than anything else, and a small
read spends much of its CPU in FastAPI's layers. An ordinary request is recognised from its
scope and answered here with the bytes and headers the routes give (both call
:mod:`service.api.bodies`); the store is read by this module's own threads (:class:`ReadThreads`,
a lighter hand-off than anyio's), never on the loop. Anything out of the ordinary (another
method, an unexpected path or query, a missing sweep, a token to check, an error) goes to
FastAPI unchanged, so every error is its problem document and the OpenAPI document its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import re
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from pydantic import ValidationError
from starlette.types import Scope, Send

from service.api.bodies import list_page_body, sweep_body
from service.api.deps import Services, may_read
from service.api.schemas import SweepListQuery

log = logging.getLogger("ksweep.service")

SWEEP_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")  # the path pattern of `SweepId`
LIST_DEFAULTS: dict[str, Any] = SweepListQuery().model_dump()
_HEADERS = b"content-type", b"application/json"


def list_params(query_string: bytes) -> dict[str, Any] | None:
    """GET /sweeps's query validated as FastAPI validates it (the same model,
    :class:`~service.api.schemas.SweepListQuery`), or None where FastAPI should decide: a value
    the model refuses (FastAPI's 422 is the contract), and a query of unusual shape (a key
    twice, a blank value, a key the route does not take), rare and read by Starlette's rules."""
    if not query_string:
        return dict(LIST_DEFAULTS)
    given: dict[str, str] = {}
    # As Starlette reads a query string: latin-1 bytes, then percent-decoded as UTF-8.
    for key, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if key in given or key not in LIST_DEFAULTS or not value:
            return None
        given[key] = value
    try:
        return SweepListQuery.model_validate(given).model_dump()
    except ValidationError:
        return None


def _authorised(scope: Scope, services: Services) -> bool:
    """Whether FastAPI's ``read_access`` would let this request read (:func:`may_read`)."""
    if not services.settings.read_auth:  # the common case: no header scan
        return True
    header = next((value.decode("latin-1") for name, value in scope["headers"]
                   if name == b"authorization"), "")
    return may_read(header, services)


Job = tuple[asyncio.AbstractEventLoop, asyncio.Future, Callable[[], Any]]


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class ReadThreads:
    """``size`` daemon threads that run blocking reads for coroutines (started on first use)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    async def run(self, read: Callable[[], Any]) -> Any:
        """``read()``'s result (or its exception), computed in one of the threads."""
        if len(self._threads) < self.size:
            self._start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, read))
        return await future

    def _start(self) -> None:
        with self._lock:
            while len(self._threads) < self.size:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"ksweep-read-{len(self._threads)}")
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, read = job
            result, error = None, None
            try:
                result = read()
            except BaseException as raised:  # noqa: BLE001 - handed to the awaiting coroutine
                error = raised
            with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nobody waits
                loop.call_soon_threadsafe(_settle, future, result, error)
            del job, future, result, error

    def close(self) -> None:
        """Let every thread end once the reads queued before have run."""
        with self._lock:
            for _ in self._threads:
                self._jobs.put(None)
            self._threads = []


class HotReads:
    """Answers the hot reads of one app (see the module's docstring); the rest is FastAPI's."""

    # A few threads: a read takes ~0.1-0.5 ms of CPU, so more than the machine's cores only
    # help while some wait on a lock; FastAPI's pool (40) is there for the rest of the API.
    THREADS = 4

    def __init__(self, prefix: str) -> None:
        self.list_path = prefix + "/sweeps"
        self.item_prefix = prefix + "/sweeps/"
        self.threads = ReadThreads(self.THREADS)

    def _reader(self, scope: Scope, services: Services) -> Callable[[], bytes | None] | None:
        path = scope["path"]
        if path == self.list_path:
            params = list_params(scope["query_string"])
            if params is None:
                return None
            return lambda: list_page_body(services, **params)
        if path.startswith(self.item_prefix) and not scope["query_string"]:
            sweep_id = path[len(self.item_prefix):]
            if SWEEP_ID.fullmatch(sweep_id):
                return lambda: sweep_body(services, sweep_id)
        return None

    async def answer(self, scope: Scope, services: Services | None, send: Send) -> bool:
        """Answer ``scope`` and return True, or return False (untouched) for FastAPI to."""
        if (services is None or scope["type"] != "http" or scope["method"] != "GET"
                or scope.get("root_path")):
            return False
        read = self._reader(scope, services)
        if read is None or not _authorised(scope, services):
            return False
        try:
            body = await self.threads.run(read)
        except Exception:  # FastAPI answers it: the same error, as its problem document
            log.debug("hot read of %s failed; handing it to FastAPI", scope["path"], exc_info=True)
            return False
        if body is None:  # no such sweep: FastAPI's 404
            return False
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode()), _HEADERS]})
        await send({"type": "http.response.body", "body": body})
        return True

"""RFC 9457 problem details for every error the API returns, and the body-size limit."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.schemas import PROBLEM_BASE, PROBLEM_MEDIA_TYPE, FieldProblem, Problem
from service.api.strict_body import ProblemHTTPError, field_problems

log = logging.getLogger("ksweep.service")


class ProblemError(Exception):
    """Raise anywhere in a request to answer with a problem document."""

    def __init__(self, status: int, title: str, detail: str | None = None, *, kind: str | None = None,
                 errors: list[FieldProblem] | None = None, headers: dict[str, str] | None = None,
                 sweep_id: str | None = None) -> None:
        super().__init__(detail or title)
        self.problem = Problem(type=PROBLEM_BASE + kind if kind else "about:blank", title=title,
                               status=status, detail=detail, errors=errors, sweep_id=sweep_id)
        self.headers = headers


def problem_response(problem: Problem, request: Request | None = None,
                     headers: dict[str, str] | None = None) -> JSONResponse:
    if request is not None and problem.instance is None:
        problem.instance = request.url.path
    return JSONResponse(problem.model_dump(exclude_none=True), status_code=problem.status,
                        media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def invalid_spec(errors: list[FieldProblem]) -> ProblemError:
    listing = "; ".join(f"{p.field}: {p.message}" for p in errors[:5])
    return ProblemError(422, "Invalid sweep spec", f"{len(errors)} problem(s): {listing}",
                        kind="invalid-spec", errors=errors)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(request: Request, error: ProblemError):
        return problem_response(error.problem.model_copy(), request, error.headers)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, error: RequestValidationError):
        problems = field_problems(list(error.errors()))
        in_body = any(str(e.get("loc", ("",))[0]) == "body" for e in error.errors())
        title = "Invalid sweep spec" if in_body and request.url.path.endswith(("/sweeps", ":validate")) \
            else "Invalid request"
        listing = "; ".join(f"{p.field}: {p.message}" for p in problems[:5])
        return problem_response(Problem(
            type=PROBLEM_BASE + ("invalid-spec" if title == "Invalid sweep spec" else "invalid-request"),
            title=title, status=422, detail=f"{len(problems)} problem(s): {listing}", errors=problems,
        ), request)

    @app.exception_handler(ValidationError)
    async def _validation(request: Request, error: ValidationError):
        return problem_response(invalid_spec(field_problems(list(error.errors()), ())).problem, request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException):
        if isinstance(error, ProblemHTTPError):  # a strict body refused while it was read
            return problem_response(error.problem.model_copy(), request)
        titles = {404: "Not found", 405: "Method not allowed", 401: "Unauthorized"}
        headers = dict(getattr(error, "headers", None) or {})
        if error.status_code == 405:
            # Starlette names only the first matching route's methods; a path served by
            # several routes (GET and POST /sweeps) allows all of theirs.
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return problem_response(Problem(title=titles.get(error.status_code, str(error.detail)),
                                        status=error.status_code, detail=str(error.detail)),
                                request, headers or None)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(Problem(title="Internal server error", status=500,
                                        detail=f"{type(error).__name__}; see the service log"), request)


def _allowed_methods(request: Request) -> list[str]:
    from starlette.routing import Match

    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


class BodySizeLimit:
    """Answers 413 to a request whose body exceeds ``max_bytes`` (declared or streamed).

    The body is read up front (it is small by construction) and replayed to the app, so
    an oversized upload is refused before any handler sees a byte of it.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, streamed: tuple[str, ...] = ()) -> None:
        self.app, self.max_bytes = app, max_bytes
        # Paths whose handlers stream and cap the body themselves (dataset uploads).
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE") \
                or scope.get("path") in self.streamed:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._reject(scope, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, send: Send) -> None:
        response = JSONResponse(
            Problem(type=PROBLEM_BASE + "body-too-large", title="Request body too large", status=413,
                    detail=f"the body exceeds {self.max_bytes} bytes (KSWEEP_MAX_BODY_BYTES)",
                    instance=scope.get("path")).model_dump(exclude_none=True),
            status_code=413, media_type=PROBLEM_MEDIA_TYPE)

        async def _noop_receive() -> Message:
            return {"type": "http.disconnect"}

        await response(scope, _noop_receive, send)

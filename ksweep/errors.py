"""The client's exceptions: one per kind of problem the API answers, each carrying the
problem document (RFC 9457) and its per-field errors."""

from __future__ import annotations

from service.api.schemas import FieldProblem, Problem

__all__ = ["ApiError", "Conflict", "Forbidden", "InvalidRequest", "KsweepError", "NotFound",
           "RateLimited", "ReportNotReady", "ServerError", "ServiceUnreachable", "SpecError",
           "Unauthorized", "WaitTimeout"]


class KsweepError(Exception):
    """Every error the client raises."""


class ServiceUnreachable(KsweepError):
    """No answer from the service (not running, wrong ``KSWEEP_URL``, network down)."""


class WaitTimeout(KsweepError, TimeoutError):
    """:meth:`ksweep.Client.wait` gave up before the sweep ended."""


class SpecError(KsweepError):
    """A local spec file could not be read or is invalid; ``errors`` names every field."""

    def __init__(self, source: str, message: str, errors: list[FieldProblem] | None = None) -> None:
        self.source, self.errors = source, errors or []
        lines = [f"{source}: {message}", *(f"  {e.field}: {e.message}" for e in self.errors)]
        super().__init__("\n".join(lines))


class ApiError(KsweepError):
    """The service answered with an error: ``status``, ``title``, ``detail`` and ``errors``
    (the field problems, empty when the problem is not about fields) from its problem document."""

    def __init__(self, problem: Problem, retry_after: float | None = None) -> None:
        self.problem = problem
        self.status, self.title, self.detail = problem.status, problem.title, problem.detail
        self.errors: list[FieldProblem] = problem.errors or []
        self.retry_after = retry_after
        lines = [f"{problem.title} ({problem.status})" + (f": {problem.detail}" if problem.detail
                                                          else "")]
        lines += [f"  {e.field}: {e.message}" for e in self.errors]
        super().__init__("\n".join(lines))


class InvalidRequest(ApiError):
    """400, 413 or 422: a malformed body, an invalid spec or parameter (see ``errors``)."""


class Unauthorized(ApiError):
    """401: no valid token (``KSWEEP_TOKEN`` or the local token file)."""


class Forbidden(ApiError):
    """403: the sweep belongs to another owner."""


class NotFound(ApiError):
    """404: no such sweep."""


class Conflict(ApiError):
    """409: an Idempotency-Key reused with another body (``problem.sweep_id`` names the sweep),
    an extension of a cancelled sweep without ``allow_cancelled``, or sweeps compared that are
    not compatible (``errors`` name every differing field)."""


class ReportNotReady(Conflict):
    """409: the sweep has no report yet (queued, running, or cancelled before its end)."""


class RateLimited(ApiError):
    """429: too many active sweeps for this owner; retry after ``retry_after`` seconds."""


class ServerError(ApiError):
    """5xx: the service (or the MLflow store behind it) failed; the detail says what."""


def error_for(problem: Problem, retry_after: float | None = None) -> ApiError:
    """The exception class matching a problem document."""
    status = problem.status
    if status == 409 and problem.type.endswith("/report-not-ready"):
        kind: type[ApiError] = ReportNotReady
    else:
        kind = {400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                409: Conflict, 413: InvalidRequest, 422: InvalidRequest,
                429: RateLimited}.get(status, ServerError if status >= 500 else ApiError)
    return kind(problem, retry_after)

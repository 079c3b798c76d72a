"""``/api/v1/healthz`` (the process answers) and ``/api/v1/readyz`` (its dependencies answer)."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Callable
from urllib.parse import urlparse

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.api.deps import Services, ServicesDep
from service.api.schemas import Check, Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness")
def healthz() -> Health:
    return Health(status="ok")


def probe_errors() -> tuple[type[BaseException], ...]:
    """What a probe of the store, Ray or MLflow raises when its dependency is down (httpx
    and SQLAlchemy load with the first probe: httpx's import brings its command line's rich and
    click)."""
    import httpx
    from sqlalchemy.exc import SQLAlchemyError

    return (OSError, RuntimeError, ValueError, ImportError, httpx.HTTPError, SQLAlchemyError,
            sqlite3.Error)


def _check(probe: Callable[[], str]) -> Check:
    try:
        return Check(ok=True, detail=probe())
    except probe_errors() as error:
        return Check(ok=False, detail=f"{type(error).__name__}: {error}"[:500])


def _store(services: Services) -> str:
    services.store.ping()
    return services.store.dialect


def _ray(services: Services) -> str:
    settings = services.settings
    if settings.launcher == "ray":
        services.launcher.ping()
        return f"Ray Jobs API at {settings.ray_jobs_url}"
    if settings.ray_address:
        target = settings.ray_address.removeprefix("ray://")
        host, _, port = target.rpartition(":")
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
            return f"Ray at {settings.ray_address}"
    import ray  # noqa: F401  (each local driver starts its own Ray)

    return "local Ray, started per sweep"


def _mlflow(services: Services) -> str:
    uri = services.settings.mlflow_tracking_uri
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        import httpx

        response = httpx.get(uri.rstrip("/") + "/health", timeout=3)
        response.raise_for_status()
        return f"MLflow server at {uri}"
    if scheme.startswith("sqlite"):
        path = uri.split("///", 1)[-1]
        sqlite3.connect(path, timeout=3).execute("select 1").close()
        return "sqlite MLflow store"
    return f"MLflow store {scheme}"


def _supervisor(services: Services) -> str:
    """Which API process supervises (several may share the store; one holds the lease)."""
    supervisor = services.supervisor
    if supervisor.leading:
        return f"leading as {supervisor.lease.holder}"
    lease = supervisor.lease.current()
    if lease is None or not lease.valid():
        return f"standby as {supervisor.lease.holder}; the lease is free, taken at the next poll"
    return f"standby as {supervisor.lease.holder}; the lease is held by {lease.holder}"


def _drivers(services: Services) -> Check:
    unknown = dict(services.supervisor.unknown_health)
    if not unknown:
        return Check(ok=True, detail="every running sweep's driver answers (or none runs here)")
    listing = ", ".join(f"{sweep_id} ({handle})" for sweep_id, handle in sorted(unknown.items())[:5])
    return Check(ok=False, detail=f"health of {len(unknown)} driver(s) unknown, asked again every "
                                  f"poll, no restart spent: {listing}")


@router.get("/readyz", response_model=Readiness,
            summary="Readiness: store, Ray, MLflow, the supervisor and its drivers",
            responses={503: {"model": Readiness, "description": "The store is not reachable."}})
def readyz(services: ServicesDep):
    """``ready``; ``degraded`` (still 200: sweeps are accepted and served) when Ray, MLflow or
    a driver's health check fails; ``unready`` (503) when the store does."""
    checks = {"store": _check(lambda: _store(services)), "ray": _check(lambda: _ray(services)),
              "mlflow": _check(lambda: _mlflow(services)),
              "supervisor": _check(lambda: _supervisor(services)), "drivers": _drivers(services)}
    if not checks["store"].ok:
        status = "unready"
    else:
        status = "ready" if all(check.ok for check in checks.values()) else "degraded"
    body = Readiness(status=status, checks=checks)
    return JSONResponse(body.model_dump(), status_code=503 if status == "unready" else 200)

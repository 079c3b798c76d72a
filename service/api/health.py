"""``/api/v1/healthz`` (the process answers) and ``/api/v1/readyz`` (its dependencies answer)."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Callable
from urllib.parse import urlparse

import httpx
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from service.api.deps import Services, get_services
from service.api.schemas import Check, Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness")
def healthz() -> Health:
    return Health(status="ok")


# What a probe of the store, Ray or MLflow raises when its dependency is down.
PROBE_ERRORS = (OSError, RuntimeError, ValueError, ImportError, httpx.HTTPError, SQLAlchemyError,
                sqlite3.Error)


def _check(probe: Callable[[], str]) -> Check:
    try:
        return Check(ok=True, detail=probe())
    except PROBE_ERRORS as error:
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
        response = httpx.get(uri.rstrip("/") + "/health", timeout=3)
        response.raise_for_status()
        return f"MLflow server at {uri}"
    if scheme.startswith("sqlite"):
        path = uri.split("///", 1)[-1]
        sqlite3.connect(path, timeout=3).execute("select 1").close()
        return "sqlite MLflow store"
    return f"MLflow store {scheme}"


@router.get("/readyz", response_model=Readiness, summary="Readiness: store, Ray and MLflow",
            responses={503: {"model": Readiness, "description": "A dependency is not reachable."}})
def readyz(services: Services = Depends(get_services)):
    checks = {"store": _check(lambda: _store(services)), "ray": _check(lambda: _ray(services)),
              "mlflow": _check(lambda: _mlflow(services))}
    ready = all(check.ok for check in checks.values())
    body = Readiness(status="ready" if ready else "unready", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

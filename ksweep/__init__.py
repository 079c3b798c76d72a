"""kappa-sweep's Python client: ``from ksweep import Client``.

    client = Client()                       # KSWEEP_URL, KSWEEP_TOKEN or the local token
    sweep = client.submit("sweeps/examples/quickstart.yaml")
    client.wait(sweep.id)                   # a tqdm bar; returns the ended sweep
    frames = client.frames(sweep.id)        # trials, cells, contrasts, history (pandas)

Importing it loads no torch, Ray, MLflow or pandas (import-linter contract and a test).
:func:`ksweep.frames.from_mlflow` reads the same frames from MLflow without the service.
"""

from __future__ import annotations

from ksweep.client import Client
from ksweep.errors import (
    ApiError,
    Conflict,
    Forbidden,
    InvalidRequest,
    KsweepError,
    NotFound,
    RateLimited,
    ReportNotReady,
    ServerError,
    ServiceUnreachable,
    SpecError,
    Unauthorized,
    WaitTimeout,
)
from service.api.schemas import History, Report, Sweep, SweepPage, Trial

__all__ = ["ApiError", "Client", "Conflict", "Forbidden", "History", "InvalidRequest",
           "KsweepError", "NotFound", "RateLimited", "Report", "ReportNotReady", "ServerError",
           "ServiceUnreachable", "SpecError", "Sweep", "SweepPage", "Trial", "Unauthorized",
           "WaitTimeout"]

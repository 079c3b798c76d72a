"""kappa-sweep's Python client: ``from ksweep import Client``.

    client = Client()                       # KSWEEP_URL, KSWEEP_TOKEN or the local token
    sweep = client.submit("sweeps/examples/quickstart.yaml")
    client.wait(sweep.id)                   # a tqdm bar; returns the ended sweep
    frames = client.frames(sweep.id)        # trials, cells, contrasts, history (pandas)

Importing it loads no torch, Ray, MLflow or pandas (import-linter contract and a test); its
names load on first use, so ``ksweep --help`` (in :mod:`ksweep.cli`) loads no httpx either.
:func:`ksweep.frames.from_mlflow` reads the same frames from MLflow without the service.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
_SCHEMAS = ("History", "Report", "Sweep", "SweepPage", "Trial")


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'ksweep' has no attribute {name!r}")
    home = ("ksweep.client" if name == "Client" else
            "service.api.schemas" if name in _SCHEMAS else "ksweep.errors")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next look-up skips this function
    return value

"""A real service (``ksweep serve``, local Ray, a sqlite MLflow store) shared by the client
tests and the notebook, and one small sweep run on it to the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.conftest import TOKENS, ServiceProcess, kill_driver_groups, tiny_spec


@pytest.fixture(scope="session")
def service(tmp_path_factory) -> Iterator[ServiceProcess]:
    workdir = tmp_path_factory.mktemp("client-service")
    # One CPU: each sweep's trials train one after another in one process (tests/sweeps/
    # test_runner._sweep says why).
    started = ServiceProcess(workdir, KSWEEP_DRIVER_NUM_CPUS="1")
    started.start()
    yield started
    started.stop()
    kill_driver_groups((workdir / "root").resolve())


@pytest.fixture(scope="session")
def service_env(service: ServiceProcess) -> dict[str, str]:
    """What a user's shell holds to reach the service as alice."""
    return {"KSWEEP_URL": service.url.removesuffix("/api/v1"), "KSWEEP_TOKEN": TOKENS["alice"],
            "MLFLOW_TRACKING_URI": service.env["MLFLOW_TRACKING_URI"]}


@pytest.fixture(scope="session")
def tracking_uri(service: ServiceProcess) -> str:
    return service.env["MLFLOW_TRACKING_URI"]


@pytest.fixture(scope="session")
def ended_sweep(service_env: dict[str, str]) -> dict:
    """A three-trial, two-epoch sweep submitted and waited for through the client; its id and
    what the client saw right after submitting (the report was not ready then)."""
    from ksweep import Client, ReportNotReady

    client = Client(service_env["KSWEEP_URL"], service_env["KSWEEP_TOKEN"])
    sweep = client.submit(tiny_spec("client", **{"template.training.epochs": 2}),
                          idempotency_key="client-tests")
    try:
        client.report(sweep.id)
        early = "report served before the sweep ended"
    except ReportNotReady as error:
        early = error
    ended = client.wait(sweep.id, progress=False, interval=0.5, timeout=540)
    return {"id": sweep.id, "submitted": sweep, "ended": ended, "early_report": early}


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]

"""A real service for the tests: ``ksweep serve`` in its own process on a free port."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.support.mlflow_store import sqlite_store_uri
from tests.support.serve_process import ServeProcess

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
TOKENS = {"alice": "alice-token", "bob": "bob-token", "admin": "admin-token"}


def auth(owner: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[owner]}"}


def spec_dict(**changes) -> dict:
    """quickstart.yaml with dotted-path changes (``template.training.epochs=3``)."""
    spec = yaml.safe_load(QUICKSTART.read_text())
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return spec


def tiny_spec(name: str = "tiny", **changes) -> dict:
    """Four rows (alpha {0, 1} x {uniform, raw_plus_ncc}, one seed), three trials after dedup
    (uniform is one objective at both alphas), 3 epochs on 256 examples."""
    base = {"name": name, "alpha": [0, 1], "loss_stacks": ["uniform", "raw_plus_ncc"],
            "seeds": 1, "template.training.epochs": 3,
            "template.data.train_size": 256, "template.data.val_size": 128}
    return spec_dict(**{**base, **changes})


class ServiceProcess(ServeProcess):
    """``ksweep serve`` on a test's folder (its store, sweep root and MLflow store there);
    restartable on the same store and port."""

    def __init__(self, workdir: Path, **settings: str) -> None:
        env = {
            **os.environ,
            "KSWEEP_HOST": "127.0.0.1",
            "KSWEEP_SWEEP_ROOT": str(workdir / "root"),
            "KSWEEP_API_TOKENS": ",".join(f"{o}:{t}" for o, t in TOKENS.items()),
            "MLFLOW_TRACKING_URI": sqlite_store_uri(workdir),
            "KSWEEP_DRIVER_NUM_CPUS": "2",
            "KSWEEP_POLL_INTERVAL_S": "0.5",
            "KSWEEP_CANCEL_GRACE_S": "5",
            "RAY_ADDRESS": "",
            "PYTHONUNBUFFERED": "1",
            # This checkout's code, whatever the venv's editable install points at.
            "PYTHONPATH": str(ROOT),
            **settings,
        }
        super().__init__(env, workdir / "serve.log", cwd=workdir)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60)


def kill_driver_groups(root: Path) -> None:
    """Teardown: stop every driver process group a test's service left behind."""
    from service.orchestrator.launchers import DRIVER_MODULE, _group_exists, signal_group

    for proc in psutil.process_iter():
        try:
            is_driver = (DRIVER_MODULE in proc.cmdline()
                         and proc.environ().get("KSWEEP_SWEEP_ROOT") == str(root))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if is_driver and signal_group(proc.pid, signal.SIGKILL):
            deadline = time.monotonic() + 10
            while _group_exists(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.2)


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator:
    """Factory of started services on ``tmp_path``; everything is stopped at teardown."""
    started: list[ServiceProcess] = []

    def make(**settings: str) -> ServiceProcess:
        service = ServiceProcess(tmp_path, **settings)
        service.start()
        started.append(service)
        return service

    yield make
    for service in started:
        service.stop()
    kill_driver_groups((tmp_path / "root").resolve())


# A paused queue (no sweep ever runs: API behaviour without training) with room for the many
# sweeps API tests store.
PAUSED_QUEUE = {"KSWEEP_MAX_CONCURRENT_SWEEPS": "0", "KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER": "1000",
          "KSWEEP_MAX_TRIALS_PER_SWEEP": "100"}


@pytest.fixture(scope="session")
def paused_service(tmp_path_factory) -> Iterator[ServiceProcess]:
    """A service whose queue is paused (:data:`PAUSED_QUEUE`): sweeps are stored and stay queued, so
    API behaviour is tested without training anything. One per pytest process, shared by the
    modules that use it (their tests count what they add, not what is there)."""
    workdir = tmp_path_factory.mktemp("paused")
    service = ServiceProcess(workdir, **PAUSED_QUEUE)
    service.start()
    yield service
    service.stop()

"""A real service for the tests: ``ksweep serve`` in its own process on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
TOKENS = {"alice": "alice-token", "bob": "bob-token", "admin": "admin-token"}


def auth(owner: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[owner]}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    """Four short trials (alpha {0, 1} x {uniform, raw_plus_ncc}, 3 epochs on 256 examples)."""
    base = {"name": name, "alpha": [0, 1], "template.training.epochs": 3,
            "template.data.train_size": 256, "template.data.val_size": 128}
    return spec_dict(**{**base, **changes})


class ServiceProcess:
    """``python -m service.cli serve`` with a given environment; restartable on its store."""

    def __init__(self, workdir: Path, **settings: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.env = {
            **os.environ,
            "KSWEEP_HOST": "127.0.0.1",
            "KSWEEP_SWEEP_ROOT": str(workdir / "root"),
            "KSWEEP_API_TOKENS": ",".join(f"{o}:{t}" for o, t in TOKENS.items()),
            "MLFLOW_TRACKING_URI": f"sqlite:///{workdir}/mlflow.db",
            "KSWEEP_DRIVER_NUM_CPUS": "2",
            "KSWEEP_POLL_INTERVAL_S": "0.5",
            "KSWEEP_CANCEL_GRACE_S": "5",
            "RAY_ADDRESS": "",
            "PYTHONUNBUFFERED": "1",
            # This checkout's code, whatever the venv's editable install points at.
            "PYTHONPATH": str(ROOT),
            **settings,
        }
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1"

    def start(self, timeout_s: float = 60.0) -> None:
        self.starts += 1
        with open(self.workdir / f"serve-{self.starts}.log", "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)],
                env=self.env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ksweep serve exited:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"ksweep serve did not come up:\n{self.log_tail()}")

    def log_tail(self) -> str:
        logs = sorted(self.workdir.glob("serve-*.log"))
        return logs[-1].read_text(errors="replace")[-4000:] if logs else ""

    def kill9(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60)


def kill_driver_groups(root: Path) -> None:
    """Teardown: stop every driver process group a test's service left behind."""
    from service.launchers import _group_exists

    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"service.driver" in cmdline and f"KSWEEP_SWEEP_ROOT={root}".encode() in environ:
            pid = int(proc.name)
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while _group_exists(pid) and time.monotonic() < deadline:
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


@pytest.fixture(scope="module")
def paused_service(tmp_path_factory) -> Iterator[ServiceProcess]:
    """A service whose queue is paused (KSWEEP_MAX_CONCURRENT_SWEEPS=0): sweeps are stored and
    stay queued, so API behaviour is tested without training anything."""
    workdir = tmp_path_factory.mktemp("paused")
    service = ServiceProcess(workdir, KSWEEP_MAX_CONCURRENT_SWEEPS="0",
                             KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER="1000",
                             KSWEEP_MAX_TRIALS_PER_SWEEP="100")
    service.start()
    yield service
    service.stop()

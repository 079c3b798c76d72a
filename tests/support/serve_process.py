"""``ksweep serve`` as a child process: started, waited for until it answers, and stopped.

``make demo``, the service tests and the service benchmark all run the real server this way.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

API_PREFIX = "/api/v1"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServeProcess:
    """``python -m ksweep.cli serve --port PORT`` with ``env``, its output in ``log_path``.

    The server runs in its own session, so signals meant for the caller do not reach it and
    :meth:`kill9` takes only the server (its sweep drivers run in sessions of their own).
    """

    def __init__(self, env: Mapping[str, str], log_path: Path, *, port: int | None = None,
                 host: str = "127.0.0.1", cwd: Path | None = None) -> None:
        self.env, self.log_path, self.host = dict(env), log_path, host
        self.port = port or free_port(host)
        self.cwd = cwd
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The API's base URL (``http://host:port/api/v1``)."""
        return f"http://{self.host}:{self.port}{API_PREFIX}"

    def start(self, timeout_s: float = 60.0, probe: str = "/healthz") -> None:
        """Start the server and return once ``probe`` answers 200 (RuntimeError otherwise)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ksweep.cli", "serve", "--port", str(self.port)],
                env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ksweep serve exited:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + probe, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"ksweep serve did not answer {probe} in {timeout_s:.0f} s:\n"
                           f"{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def kill9(self) -> None:
        """SIGKILL the server alone (what a crash looks like to its drivers)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGINT (a graceful uvicorn shutdown), then SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

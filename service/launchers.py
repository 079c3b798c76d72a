"""How a sweep's driver runs: a local process (embedded default) or a Ray Job.

Either way the driver is ``python -m service.driver SWEEP_ID``: it reads the spec from
the store, runs the Ray Tune driver (which resumes from the Tune state when there is
one) and writes its progress back to the store. A driver outlives the API that started
it, so an API restart re-attaches to it through its handle.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

from service.settings import Settings

DRIVER_MODULE = "service.driver"


class Launcher(Protocol):
    """Starts, watches and stops sweep drivers."""

    name: str

    def launch(self, sweep_id: str, attempt: int) -> str:
        """Start the driver; returns its handle (stored with the sweep)."""

    def is_alive(self, sweep_id: str, handle: str) -> bool:
        """Whether the driver behind ``handle`` still runs."""

    def exit_reason(self, sweep_id: str, handle: str) -> str:
        """Why a driver that is no longer alive ended (for the sweep's error)."""

    def stop(self, sweep_id: str, handle: str, grace_s: float) -> None:
        """Stop the driver and every trial it runs; returns once they are gone."""

    def ping(self) -> None:
        """Raise when the launcher cannot reach what it launches on."""


def driver_environment(settings: Settings) -> dict[str, str]:
    """The settings a driver needs, as environment variables (absolute paths only)."""
    env = {
        "KSWEEP_DATABASE_URL": settings.store_url,
        "KSWEEP_SWEEP_ROOT": str(settings.sweep_root),
        "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri,
        "KSWEEP_MLFLOW_UI_URL": settings.mlflow_ui_url,
        "PYTHONUNBUFFERED": "1",
    }
    if settings.driver_num_cpus:
        env["KSWEEP_DRIVER_NUM_CPUS"] = str(settings.driver_num_cpus)
    return env


def _driver_log(settings: Settings, sweep_id: str, attempt: int) -> Path:
    folder = settings.sweep_root / sweep_id
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"driver-{attempt}.log"


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class LocalLauncher:
    """One driver process per sweep on this machine, in its own process group.

    The group holds the driver and the local Ray it starts (GCS, raylet, trial workers),
    so stopping the group stops the trials too; the API's own death does not touch it.
    """

    name = "local"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._children: dict[int, subprocess.Popen] = {}

    def launch(self, sweep_id: str, attempt: int) -> str:
        log_path = _driver_log(self.settings, sweep_id, attempt)
        env = {**os.environ, **driver_environment(self.settings)}
        if self.settings.ray_address:
            env["RAY_ADDRESS"] = self.settings.ray_address
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", DRIVER_MODULE, sweep_id], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, cwd=self.settings.sweep_root,
            )
        self._children[process.pid] = process
        return f"pid:{process.pid}@{socket.gethostname()}"

    @staticmethod
    def _pid(handle: str) -> int | None:
        if not handle.startswith("pid:"):
            return None
        pid, _, host = handle[4:].partition("@")
        if host != socket.gethostname() or not pid.isdigit():
            return None
        return int(pid)

    def is_alive(self, sweep_id: str, handle: str) -> bool:
        pid = self._pid(handle)
        if pid is None:
            return False
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        return _is_driver_process(pid, sweep_id)

    def exit_reason(self, sweep_id: str, handle: str) -> str:
        pid = self._pid(handle)
        child = self._children.pop(pid, None) if pid is not None else None
        code = child.poll() if child is not None else None
        what = f"exit code {code}" if code is not None else "it is no longer running"
        attempt = handle_attempt_log(self.settings, sweep_id)
        tail = log_tail(attempt) if attempt else ""
        return f"driver process {handle} ended ({what})" + (f"; last log lines:\n{tail}" if tail else "")

    def stop(self, sweep_id: str, handle: str, grace_s: float) -> None:
        pid = self._pid(handle)
        if pid is None:
            return
        # SIGTERM first (Tune saves its state), SIGKILL for whatever is left of the group.
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            if self._wait_group_gone(pid, wait_s):
                break
        child = self._children.pop(pid, None)
        if child is not None:
            child.poll()

    def _wait_group_gone(self, pgid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            child = self._children.get(pgid)
            if child is not None:
                child.poll()  # reap our own child, or it lingers as a zombie group member
            if not _group_exists(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def ping(self) -> None:
        return None


def handle_attempt_log(settings: Settings, sweep_id: str) -> Path | None:
    logs = sorted((settings.sweep_root / sweep_id).glob("driver-*.log"),
                  key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None


def _is_driver_process(pid: int, sweep_id: str) -> bool:
    """A live (not zombie) process that is this sweep's driver (guards against pid reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    return DRIVER_MODULE.encode() in cmdline and sweep_id.encode() in cmdline


def _group_exists(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


class RayJobLauncher:
    """One Ray Job per sweep (``submission_id`` = the sweep id; restarts add ``-rN``)."""

    name = "ray"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client = None

    def _headers(self) -> dict[str, str]:
        token = os.environ.get("RAY_AUTH_TOKEN")
        path = os.environ.get("RAY_AUTH_TOKEN_PATH")
        if not token and path and Path(path).is_file():
            token = Path(path).read_text().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def client(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.settings.ray_jobs_url, headers=self._headers())
        return self._client

    @staticmethod
    def submission_id(sweep_id: str, attempt: int) -> str:
        return sweep_id if attempt <= 1 else f"{sweep_id}-r{attempt - 1}"

    def launch(self, sweep_id: str, attempt: int) -> str:
        submission_id = self.submission_id(sweep_id, attempt)
        self.client().submit_job(
            entrypoint=f"{sys.executable} -m {DRIVER_MODULE} {sweep_id}",
            submission_id=submission_id,
            runtime_env={"env_vars": driver_environment(self.settings)},
            metadata={"ksweep.sweep_id": sweep_id, "ksweep.attempt": str(attempt)},
        )
        return f"ray-job:{submission_id}"

    def _status(self, handle: str):
        return self.client().get_job_status(handle.removeprefix("ray-job:"))

    def is_alive(self, sweep_id: str, handle: str) -> bool:
        try:
            return str(self._status(handle)) in ("PENDING", "RUNNING", "JobStatus.PENDING",
                                                 "JobStatus.RUNNING")
        except Exception:
            # Unknown to the cluster (restarted head) or unreachable: not running as far as we
            # can tell; the supervisor restarts it and Tune resumes from the shared state.
            return False

    def exit_reason(self, sweep_id: str, handle: str) -> str:
        try:
            info = self.client().get_job_info(handle.removeprefix("ray-job:"))
            return f"Ray Job {handle} ended {info.status}: {info.message or ''}".strip()
        except Exception as error:
            return f"Ray Job {handle} is gone ({type(error).__name__}: {error})"

    def stop(self, sweep_id: str, handle: str, grace_s: float) -> None:
        job_id = handle.removeprefix("ray-job:")
        try:
            self.client().stop_job(job_id)
        except Exception:
            return
        deadline = time.monotonic() + grace_s + 20.0
        while time.monotonic() < deadline and self.is_alive(sweep_id, handle):
            time.sleep(0.5)

    def ping(self) -> None:
        self.client().list_jobs()


def make_launcher(settings: Settings) -> Launcher:
    return RayJobLauncher(settings) if settings.launcher == "ray" else LocalLauncher(settings)

"""How a sweep's driver runs: a local process (embedded default) or a Ray Job.

Either way the driver is ``python -m service.driver SWEEP_ID``: it reads the spec from
the store, runs the Ray Tune driver (which resumes from the Tune state when there is
one) and writes its progress back to the store. A driver outlives the API that started
it, so an API restart re-attaches to it through its handle.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil

from service.orchestrator.driver_env import LOCAL_RAY_ENV, TUNE_ENV
from service.settings import Settings
from workers.contract import SWEEP_ID_TAG

DRIVER_MODULE = "service.driver"
ATTEMPT_TAG = "ksweep.attempt"  # a Ray Job's metadata: which start of its sweep it is
log = logging.getLogger("ksweep.launchers")


class DriverHealth(StrEnum):
    """What a launcher can say about a driver. ``dead`` makes the supervisor restart it (a
    restart of the sweep's budget); ``unknown`` (the cluster did not answer) waits for the next
    look; ``lost`` (the cluster answers again but no longer knows the driver: a Ray head that
    restarted without its state) restarts it without spending the budget when the head was
    back within ``KSWEEP_HEAD_RESTART_WINDOW_S`` (:mod:`service.orchestrator.supervisor`)."""

    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"
    LOST = "lost"


class Launcher(Protocol):
    """Starts, watches and stops sweep drivers."""

    name: str

    def launch(self, sweep_id: str, attempt: int, relaunch: int = 0) -> str:
        """Start the driver; returns its handle (stored with the sweep). ``relaunch`` counts
        the starts of this attempt after a lost head (:func:`head_relaunches`)."""

    def health(self, sweep_id: str, handle: str) -> DriverHealth:
        """Whether the driver behind ``handle`` still runs, has ended, or cannot be told."""

    def exit_reason(self, sweep_id: str, handle: str) -> str:
        """Why a driver that is no longer alive ended (for the sweep's error)."""

    def stop(self, sweep_id: str, handle: str, grace_s: float) -> None:
        """Stop the driver and every trial it runs; returns once they are gone."""

    def ping(self) -> None:
        """Raise when the launcher cannot reach what it launches on."""


SECRET_ENV = ("KSWEEP_API_TOKENS", "KSWEEP_TOKEN")
# Marks a driver started again after its Ray head restarted without its state: the Ray Job
# "<sweep>-r1-h2" is attempt 2's third start (the service's sweep ids are hex: no "-h" in them).
HEAD_RELAUNCH_MARK = "-h"


def head_relaunches(handle: str | None) -> int:
    """How many times the driver behind ``handle`` was started again after a lost head."""
    _, mark, count = (handle or "").rpartition(HEAD_RELAUNCH_MARK)
    return int(count) if mark and count.isdigit() else 0


def driver_environment(settings: Settings) -> dict[str, str]:
    """The settings a driver needs, as environment variables (absolute paths only)."""
    env = {
        "KSWEEP_DATABASE_URL": settings.store_url,
        "KSWEEP_SWEEP_ROOT": str(settings.sweep_root),
        "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri,
        "KSWEEP_MLFLOW_UI_URL": settings.mlflow_ui_url,
        "PYTHONUNBUFFERED": "1",
        # Tune's knobs (a value the API's own environment sets wins).
        **{name: os.environ.get(name, value) for name, value in TUNE_ENV.items()},
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

    def launch(self, sweep_id: str, attempt: int, relaunch: int = 0) -> str:
        log_path = _driver_log(self.settings, sweep_id, attempt)
        # The API's tokens stay in the API: a driver and its trials never see them.
        env = {name: value for name, value in os.environ.items() if name not in SECRET_ENV}
        env.update(driver_environment(self.settings))
        if self.settings.ray_address:
            env["RAY_ADDRESS"] = self.settings.ray_address
        else:
            # Its own local Ray: on loopback only, no idle workers (driver_env.LOCAL_RAY_ENV).
            env.update({name: os.environ.get(name, value) for name, value in LOCAL_RAY_ENV.items()})
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

    def health(self, sweep_id: str, handle: str) -> DriverHealth:
        pid = self._pid(handle)
        if pid is None:
            return DriverHealth.DEAD
        child = self._children.get(pid)
        alive = child.poll() is None if child is not None else _is_driver_process(pid, sweep_id)
        return DriverHealth.ALIVE if alive else DriverHealth.DEAD

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
            if not signal_group(pid, sig) or self._wait_group_gone(pid, wait_s):
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


_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def _is_driver_process(pid: int, sweep_id: str) -> bool:
    """A live (not zombie) process that is this sweep's driver (guards against pid reuse)."""
    try:
        process = psutil.Process(pid)
        if process.status() in _GONE:
            return False
        cmdline = process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return DRIVER_MODULE in cmdline and sweep_id in cmdline


def group_members(pgid: int) -> list[psutil.Process]:
    """The live (non-zombie) processes of process group ``pgid``."""
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if process.info["status"] not in _GONE and os.getpgid(process.pid) == pgid:
                members.append(process)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def _group_exists(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in process group ``pgid``."""
    return bool(group_members(pgid))


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


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

    def client(self) -> Any:
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.settings.ray_jobs_url, headers=self._headers())
        return self._client

    @staticmethod
    def submission_id(sweep_id: str, attempt: int, relaunch: int = 0) -> str:
        base = sweep_id if attempt <= 1 else f"{sweep_id}-r{attempt - 1}"
        return base + (f"{HEAD_RELAUNCH_MARK}{relaunch}" if relaunch else "")

    def launch(self, sweep_id: str, attempt: int, relaunch: int = 0) -> str:
        submission_id = self.submission_id(sweep_id, attempt, relaunch)
        self.client().submit_job(
            entrypoint=f"{sys.executable} -m {DRIVER_MODULE} {sweep_id}",
            submission_id=submission_id,
            runtime_env={"env_vars": driver_environment(self.settings)},
            metadata={SWEEP_ID_TAG: sweep_id, ATTEMPT_TAG: str(attempt)},
        )
        return f"ray-job:{submission_id}"

    def health(self, sweep_id: str, handle: str) -> DriverHealth:
        """Asks the Jobs API (``GET /api/jobs/{id}``) with a timeout.

        A job the cluster does not know (404: a head restarted without its state) is lost, and
        the restarted driver resumes from the shared Tune state; no answer, an error status
        or a timeout is unknown, so a dashboard blip never spends a restart.
        """
        job_id = handle.removeprefix("ray-job:")
        url = f"{self.settings.ray_jobs_url.rstrip('/')}/api/jobs/{job_id}"
        try:
            response = httpx.get(url, headers=self._headers(), timeout=self.settings.ray_jobs_timeout_s)
        except httpx.HTTPError as error:
            log.warning("sweep %s: the Jobs API did not answer (%s); driver health unknown",
                        sweep_id, error)
            return DriverHealth.UNKNOWN
        if response.status_code == 404:
            return DriverHealth.LOST
        if response.status_code != 200:
            log.warning("sweep %s: the Jobs API answered %d; driver health unknown",
                        sweep_id, response.status_code)
            return DriverHealth.UNKNOWN
        status = str(response.json().get("status", ""))
        return DriverHealth.ALIVE if status in ("PENDING", "RUNNING") else DriverHealth.DEAD

    def exit_reason(self, sweep_id: str, handle: str) -> str:
        try:
            info = self.client().get_job_info(handle.removeprefix("ray-job:"))
            return f"Ray Job {handle} ended {info.status}: {info.message or ''}".strip()
        except (RuntimeError, OSError) as error:  # the SDK's errors: not found, unreachable
            return f"Ray Job {handle} is gone ({type(error).__name__}: {error})"

    def stop(self, sweep_id: str, handle: str, grace_s: float) -> None:
        job_id = handle.removeprefix("ray-job:")
        try:
            self.client().stop_job(job_id)
        except (RuntimeError, OSError) as error:  # already gone, or the cluster with it
            log.warning("sweep %s: could not stop Ray Job %s: %s", sweep_id, job_id, error)
            return
        deadline = time.monotonic() + grace_s + 20.0
        while time.monotonic() < deadline and self.health(sweep_id, handle) != DriverHealth.DEAD:
            time.sleep(0.5)

    def ping(self) -> None:
        # Bounded like a health check: the SDK's calls have no timeout, and a stopped
        # dashboard (SIGSTOP) would hang /readyz.
        response = httpx.get(f"{self.settings.ray_jobs_url.rstrip('/')}/api/version",
                             headers=self._headers(), timeout=self.settings.ray_jobs_timeout_s)
        response.raise_for_status()


def make_launcher(settings: Settings) -> Launcher:
    return RayJobLauncher(settings) if settings.launcher == "ray" else LocalLauncher(settings)

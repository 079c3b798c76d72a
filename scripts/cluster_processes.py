"""Process bookkeeping for ``scripts/local-cluster``: start, find, wait for and stop its processes.

Every process the local cluster starts gets one environment variable, ``KSWEEP_LOCAL_CLUSTER``,
set to an id unique to that ``up``. Environments are inherited, so the id also marks what those
processes start in turn: Ray's daemons and workers, job drivers (which Ray starts in sessions of
their own), MLflow's and Postgres's workers. ``down`` stops the processes it recorded, then
everything still carrying the id, and nothing else: never ``ray stop``, which stops every Ray on
the machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

MARKER_ENV = "KSWEEP_LOCAL_CLUSTER"


class ClusterError(RuntimeError):
    """A part of the cluster did not start or stop; the message says which and why."""


@dataclass(frozen=True)
class Proc:
    """A process we started, identified by pid *and* start time so a reused pid is never hit."""

    name: str
    pid: int
    start_time: float
    log: str

    def alive(self) -> bool:
        return start_time_of(self.pid) == self.start_time


_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def start_time_of(pid: int) -> float | None:
    """The process's start time (psutil's create_time; None: no such process, or a zombie)."""
    try:
        process = psutil.Process(pid)
        return None if process.status() in _GONE else process.create_time()
    except psutil.NoSuchProcess:
        return None


def spawn(name: str, argv: Sequence[str], *, env: dict[str, str], log: Path, cwd: Path) -> Proc:
    """Start ``argv`` in a session of its own with stdout and stderr appended to ``log``."""
    with open(log, "ab") as out:
        child = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Its own session: Ctrl-C in the terminal that ran `up` does not reach it, and it
            # outlives `up` (which only starts things).
            start_new_session=True,
        )
    start = None
    for _ in range(100):  # the process is visible as soon as fork returns; be patient anyway
        start = start_time_of(child.pid)
        if start is not None:
            break
        time.sleep(0.01)
    return Proc(name=name, pid=child.pid, start_time=start or 0.0, log=str(log))


def run_checked(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
                what: str, timeout: float = 120) -> str:
    """Run a short command to completion; a failure raises ClusterError with its output."""
    try:
        done = subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        raise ClusterError(f"{what} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def tail(path: str | Path, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def wait_until(proc: Proc, check: Callable[[], bool], *, what: str, timeout: float) -> float:
    """Poll ``check`` until it holds; returns the seconds waited.

    Raises ClusterError naming the part, with the tail of its log, when the process dies first
    or ``timeout`` passes.
    """
    started = time.monotonic()
    while True:
        if check():
            return time.monotonic() - started
        if not proc.alive():
            raise ClusterError(f"{proc.name} exited before {what}; last lines of {proc.log}:\n"
                               f"{tail(proc.log)}")
        if time.monotonic() - started > timeout:
            raise ClusterError(f"{proc.name}: no {what} after {timeout:.0f}s; last lines of "
                               f"{proc.log}:\n{tail(proc.log)}")
        time.sleep(0.25)


def http_ok(url: str, headers: dict[str, str] | None = None, timeout: float = 2.0) -> bool:
    """True when GET ``url`` answers 2xx."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 right now (all held open while choosing)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def marked_pids(marker: str) -> list[int]:
    """Pids of live processes whose environment carries ``KSWEEP_LOCAL_CLUSTER=<marker>``."""
    mine = {os.getpid(), os.getppid()}
    found = []
    for process in psutil.process_iter(["status"]):
        if process.pid in mine or process.info["status"] in _GONE:
            continue
        try:
            if process.environ().get(MARKER_ENV) == marker:
                found.append(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # gone meanwhile, or not ours
            continue
    return sorted(found)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def stop(signals: Sequence[tuple[Proc, int]], grace: float = 15.0) -> list[str]:
    """Send each process its signal at once, then wait for them all to exit.

    Whichever is still alive after ``grace`` seconds gets SIGKILL, with its process group (each
    was started in a session of its own, so its pid is its group). Returns the names of those.
    """
    live = [(proc, sig) for proc, sig in signals if proc.alive()]
    for proc, sig in live:
        _signal(proc.pid, sig)
    deadline = time.monotonic() + grace
    while any(proc.alive() for proc, _ in live) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = []
    for proc, _ in live:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            _signal(proc.pid, signal.SIGKILL)
            killed.append(proc.name)
    return killed


def stop_marked(marker: str, grace: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process still carrying ``marker``; returns the pids found."""
    first = marked_pids(marker)
    for pid in first:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    for _ in range(5):
        left = marked_pids(marker)
        if not left:
            break
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.2)
    return first

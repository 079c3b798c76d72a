"""Real servers the fault tests stop and start again on the same port and data: an
``mlflow server`` (sqlite store, served artifacts) and a Postgres (``initdb`` + ``postgres``;
as the ``postgres`` user when the tests run as root, since Postgres refuses root)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.support.mlflow_store import sqlite_store_uri
from tests.support.serve_process import free_port

HOST = "127.0.0.1"


def postgres_bin() -> Path | None:
    """The folder of ``initdb`` (on PATH or Debian's /usr/lib/postgresql/*/bin), else None."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


class _Server:
    """A child process in its own session, stopped with its whole process group."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def _wait_up(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{what} exited: {self.log_tail()}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"{what} not up in {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
        """Signal the process group and wait until the leader is gone (then SIGKILL the rest)."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, sig)
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        except ProcessLookupError:
            pass
        with contextlib.suppress(ProcessLookupError):  # workers the leader left behind
            os.killpg(self.process.pid, signal.SIGKILL)


class MlflowServer(_Server):
    """``mlflow server`` on ``workdir/mlflow.db`` and ``workdir/mlartifacts``, one worker."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir / "mlflow-server.log")
        self.workdir, self.port = workdir, free_port(HOST)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout_s: float = 120.0) -> None:
        argv = [str(Path(sys.executable).parent / "mlflow"), "server",
                "--backend-store-uri", sqlite_store_uri(self.workdir),
                "--artifacts-destination", str(self.workdir / "mlartifacts"), "--serve-artifacts",
                "--host", HOST, "--port", str(self.port), "--workers", "1"]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self._spawn(argv, env, self.workdir)
        self._wait_up(self.answers, timeout_s, "mlflow server")

    def answers(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


class Postgres(_Server):
    """A throwaway Postgres on a free loopback port, trust authentication, one database."""

    def __init__(self, workdir: Path, database: str = "ksweep") -> None:
        super().__init__(workdir / "postgres.log")
        bin_dir = postgres_bin()
        if bin_dir is None:
            raise RuntimeError("Postgres binaries not found (apt-get install postgresql)")
        self.bin_dir, self.database, self.port = bin_dir, database, free_port(HOST)
        # Outside pytest's 0700 folders, which the postgres user could not reach.
        self._outer = Path(tempfile.mkdtemp(prefix="ksweep-pg-", dir="/tmp"))
        self._outer.chmod(0o711)
        self.folder = self._outer / "pg"
        self.as_user: list[str] = []
        self.folder.mkdir(mode=0o700)
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.folder, account.pw_uid, account.pw_gid)
            self.as_user = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                            "--init-groups", "--"]
        subprocess.run([*self.as_user, str(bin_dir / "initdb"), "-D", str(self.folder / "data"),
                        "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale",
                        "--no-sync", "--no-instructions"],
                       cwd=self.folder, check=True, capture_output=True, timeout=120)

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of its database (psycopg 3)."""
        return f"postgresql+psycopg://postgres@{HOST}:{self.port}/{self.database}"

    def _ready(self) -> bool:
        result = subprocess.run([str(self.bin_dir / "pg_isready"), "-q", "-h", HOST, "-p",
                                 str(self.port), "-U", "postgres"], capture_output=True, timeout=10)
        return result.returncode == 0

    def start(self, timeout_s: float = 60.0) -> None:
        argv = [*self.as_user, str(self.bin_dir / "postgres"), "-D", str(self.folder / "data"),
                "-c", f"listen_addresses={HOST}", "-c", f"port={self.port}",
                "-c", f"unix_socket_directories={self.folder}", "-c", "fsync=off",
                "-c", "shared_buffers=32MB"]
        self._spawn(argv, dict(os.environ), self.folder)
        self._wait_up(self._ready, timeout_s, "postgres")
        subprocess.run([str(self.bin_dir / "createdb"), "-h", HOST, "-p", str(self.port),
                        "-U", "postgres", self.database], capture_output=True, timeout=30)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 30.0) -> None:
        """A fast shutdown (SIGINT: open sessions are ended) by default."""
        super().stop(sig, timeout_s)

    def remove(self) -> None:
        """Stop it and delete its data."""
        self.stop()
        shutil.rmtree(self._outer, ignore_errors=True)

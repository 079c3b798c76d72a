"""Where a local cluster keeps its files, and the small helpers its parts share."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from cluster_processes import ClusterError
from filelock import FileLock

HOST = "127.0.0.1"
PG_ROLE = "ksweep"
SERVICE_DB = "ksweep"
MLFLOW_DB = "mlflow"
# Parts in start order.
PARTS = ("postgres", "mlflow", "ray-head", "ray-worker", "api")
# `down` stops the API first (no new Ray Jobs), Postgres last (everything else is its client).
STOP_STAGES = (("api",), ("ray-worker", "ray-head", "mlflow"), ("postgres",))
# Enough for the tiny example sweeps; Ray's default (30% of RAM per node) would pin GBs of /dev/shm.
OBJECT_STORE_BYTES = 256 * 1024 * 1024
# Environment a caller may have set that must not leak into the cluster's processes.
SCRUBBED_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                "MLFLOW_TRACKING_URI", "PGPASSFILE", "PGPASSWORD", "PGHOST", "PGPORT", "PGUSER",
                "PGDATABASE")



def log(message: str) -> None:
    print(f"local-cluster: {message}", file=sys.stderr, flush=True)


class Layout:
    """Where each file of one local cluster lives."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()
        self.state_file = self.root / "state.json"
        self.lock_file = self.root / ".lock"
        self.logs = self.root / "logs"
        self.run_link = self.root / "run"
        self.api_token = self.root / "api-token"
        self.ray_token = self.root / "ray-auth-token"
        self.pgpass = self.root / "pgpass"
        self.api_env = self.root / "api.env"
        self.artifacts = self.root / "mlflow-artifacts"
        self.sweeps = self.root / "sweeps"

    def secrets(self) -> tuple[Path, ...]:
        return (self.api_token, self.ray_token, self.pgpass, self.api_env)


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to a fresh file readable by its owner only, whatever the umask."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)


def venv_tool(name: str) -> str:
    """The console script next to this interpreter (the project's venv), else one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise ClusterError(f"`{name}` not found beside {sys.executable} nor on PATH")
    return found


def postgres_bin() -> Path:
    """Directory of Postgres's server binaries (Debian keeps them off PATH, in /usr/lib)."""
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if not versions:
        raise ClusterError("postgres: `initdb` not found on PATH nor in /usr/lib/postgresql/*/bin "
                           "(apt-get install postgresql)")
    return versions[-1].parent



@contextlib.contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """One `up`/`down`/`status` at a time per state directory."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with FileLock(layout.lock_file):
        yield

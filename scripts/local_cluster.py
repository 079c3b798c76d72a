"""The loopback twin of the docker-compose cluster: the same parts, as processes on 127.0.0.1.

    scripts/local-cluster up [--no-api]   start Postgres, MLflow, a Ray head and worker, the API
    scripts/local-cluster status          one `name: value` line per part (exit 1 if one is down)
    scripts/local-cluster down            stop every process `up` started, and nothing else

Everything lives in one state directory, ``$KSWEEP_CLUSTER_DIR`` or ``./.ksweep/cluster``:
tokens, logs, MLflow artifacts, the sweep root, ``state.json`` (ports and pids). Postgres's data
and Ray's temp dir live in a short run directory under /tmp (``<state>/run`` points at it):
Postgres runs as the ``postgres`` user, which must be able to reach its data directory, and
Ray's socket paths must stay under the 107-byte limit. ``down`` deletes the run directory (the
Postgres data is temporary) after copying Ray's logs to ``<state>/logs/ray``; logs, artifacts
and the sweep root stay for a look afterwards, until the next ``up`` starts afresh.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from cluster_processes import (
    MARKER_ENV,
    ClusterError,
    Proc,
    free_ports,
    http_ok,
    port_open,
    run_checked,
    spawn,
    stop,
    stop_marked,
    wait_until,
)

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


class Cluster:
    """One local cluster: its state file, and starting, checking and stopping its parts."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.state: dict = {}

    # --- state -------------------------------------------------------------------------------

    def load(self) -> bool:
        try:
            self.state = json.loads(self.layout.state_file.read_text())
        except (OSError, ValueError):
            self.state = {}
        return bool(self.state)

    def save(self) -> None:
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        tmp.replace(self.layout.state_file)

    def procs(self) -> list[Proc]:
        return [Proc(**item) for item in self.state.get("procs", [])]

    def record(self, proc: Proc) -> Proc:
        self.state.setdefault("procs", []).append(asdict(proc))
        self.save()
        return proc

    @property
    def ports(self) -> dict[str, int]:
        return self.state["ports"]

    @property
    def run_dir(self) -> Path:
        return Path(self.state["run_dir"])

    def url(self, part: str) -> str:
        return f"http://{HOST}:{self.ports[part]}"

    def ray_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.layout.ray_token.read_text().strip()}"}

    def env(self, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items()
               if key not in SCRUBBED_ENV and not key.startswith("KSWEEP_")}
        env[MARKER_ENV] = self.state["marker"]
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def ray_env(self) -> dict[str, str]:
        # Head, worker and every client share the token through its file; nothing reads or
        # writes ~/.ray/auth_token. MLflow and the sweep root are the cluster's, as in compose.
        return self.env(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(self.layout.ray_token),
            RAY_USAGE_STATS_ENABLED="0",
            MLFLOW_TRACKING_URI=self.url("mlflow"),
            KSWEEP_SWEEP_ROOT=str(self.layout.sweeps),
        )

    # --- up ----------------------------------------------------------------------------------

    def prepare(self) -> None:
        layout = self.layout
        # A fresh cluster: the last one's Postgres is gone, so its artifacts, Tune state and
        # logs (kept by `down` for a look afterwards) would only mislead.
        for path in (layout.logs, layout.artifacts, layout.sweeps):
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
        run_dir = Path(tempfile.mkdtemp(prefix="ksw-", dir="/tmp"))
        run_dir.chmod(0o711)  # the postgres user must reach run/pg, and nothing more
        layout.run_link.unlink(missing_ok=True)
        layout.run_link.symlink_to(run_dir)
        names = ("postgres", "mlflow", "ray-gcs", "ray-dashboard", "ray-client",
                 "ray-head-agent", "ray-worker-agent", "api")
        self.state = {
            "marker": uuid.uuid4().hex,
            "root": str(layout.root),
            "run_dir": str(run_dir),
            "ports": dict(zip(names, free_ports(len(names)), strict=True)),
            "procs": [],
            "started_at": time.time(),
        }
        self.save()
        write_secret(layout.api_token, secrets.token_urlsafe(32) + "\n")
        write_secret(layout.ray_token, secrets.token_hex(32) + "\n")
        self.pg_password = secrets.token_hex(24)
        write_secret(layout.pgpass, f"{HOST}:{self.ports['postgres']}:*:{PG_ROLE}:{self.pg_password}\n")

    def timeout(self) -> float:
        return float(os.environ.get("KSWEEP_CLUSTER_TIMEOUT", "240"))

    def start_postgres(self) -> Proc:
        bin_dir = postgres_bin()
        pg_dir = self.run_dir / "pg"
        data = pg_dir / "data"
        pg_dir.mkdir(mode=0o700)
        as_postgres: list[str] = []
        if os.geteuid() == 0:  # Postgres refuses to run as root
            try:
                account = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise ClusterError("postgres: running as root but there is no `postgres` user to "
                                   "run the server as") from exc
            os.chown(pg_dir, account.pw_uid, account.pw_gid)
            as_postgres = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                           "--init-groups", "--"]
        run_checked(
            [*as_postgres, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
             # Only local users who can reach the 0700 socket directory (postgres, root) skip
             # the password; TCP (127.0.0.1 only) needs the generated one.
             "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale",
             "--no-sync", "--no-instructions"],
            env=self.env(), cwd=pg_dir, what="postgres: initdb",
        )
        settings = {
            "listen_addresses": HOST,
            "port": str(self.ports["postgres"]),
            "unix_socket_directories": str(pg_dir),
            # The data is thrown away at `down`: durability buys nothing here.
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
        }
        argv = [*as_postgres, str(bin_dir / "postgres"), "-D", str(data)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        proc = self.record(spawn("postgres", argv, env=self.env(), cwd=pg_dir,
                                 log=self.layout.logs / "postgres.log"))
        ready = [str(bin_dir / "pg_isready"), "-q", "-h", str(pg_dir), "-p",
                 str(self.ports["postgres"]), "-U", "postgres"]

        def accepting() -> bool:
            try:
                run_checked(ready, env=self.env(), what="pg_isready", timeout=10)
            except ClusterError:
                return False
            return True

        wait_until(proc, accepting, what="connections", timeout=self.timeout())
        sql = (f"CREATE ROLE {PG_ROLE} LOGIN PASSWORD '{self.pg_password}';\n"
               f"CREATE DATABASE {MLFLOW_DB} OWNER {PG_ROLE};\n"
               f"CREATE DATABASE {SERVICE_DB} OWNER {PG_ROLE};\n")
        script = pg_dir / "setup.sql"
        write_secret(script, sql)
        try:
            if as_postgres:
                os.chown(script, pwd.getpwnam("postgres").pw_uid, -1)
            run_checked([*as_postgres, str(bin_dir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                         "-h", str(pg_dir), "-p", str(self.ports["postgres"]), "-U", "postgres",
                         "-d", "postgres", "-f", str(script)],
                        env=self.env(), cwd=pg_dir, what="postgres: creating role and databases")
        finally:
            script.unlink(missing_ok=True)
        return proc

    def pg_url(self, database: str, driver: str = "postgresql", password: bool = False) -> str:
        secret = f":{self.pg_password}" if password else ""
        return f"{driver}://{PG_ROLE}{secret}@{HOST}:{self.ports['postgres']}/{database}"

    def start_mlflow(self) -> Proc:
        argv = [venv_tool("mlflow"), "server",
                # No password on the command line (ps shows it to everyone): libpq reads PGPASSFILE.
                "--backend-store-uri", self.pg_url(MLFLOW_DB, "postgresql+psycopg"),
                "--artifacts-destination", str(self.layout.artifacts), "--serve-artifacts",
                "--host", HOST, "--port", str(self.ports["mlflow"]), "--workers", "1"]
        # Job execution (GenAI scorer jobs) would start seven more processes, unused here.
        env = self.env(PGPASSFILE=str(self.layout.pgpass), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        return self.record(spawn("mlflow", argv, env=env, cwd=self.layout.root,
                                 log=self.layout.logs / "mlflow.log"))

    def ray_node_args(self, agent_port: str) -> list[str]:
        return ["--block", "--log-style=record", "--log-color=false",
                f"--node-ip-address={HOST}", "--num-cpus=1", "--num-gpus=0",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                f"--dashboard-agent-listen-port={self.ports[agent_port]}",
                f"--temp-dir={self.run_dir / 'ray'}",
                # 0: each worker binds a port the kernel picks, so two nodes never collide.
                "--min-worker-port=0", "--max-worker-port=0"]

    def start_ray_head(self) -> Proc:
        argv = [venv_tool("ray"), "start", "--head", f"--port={self.ports['ray-gcs']}",
                f"--dashboard-host={HOST}", f"--dashboard-port={self.ports['ray-dashboard']}",
                f"--ray-client-server-port={self.ports['ray-client']}",
                *self.ray_node_args("ray-head-agent")]
        return self.record(spawn("ray-head", argv, env=self.ray_env(), cwd=self.layout.root,
                                 log=self.layout.logs / "ray-head.log"))

    def start_ray_worker(self) -> Proc:
        argv = [venv_tool("ray"), "start", f"--address={HOST}:{self.ports['ray-gcs']}",
                *self.ray_node_args("ray-worker-agent")]
        return self.record(spawn("ray-worker", argv, env=self.ray_env(), cwd=self.layout.root,
                                 log=self.layout.logs / "ray-worker.log"))

    def api_environment(self) -> dict[str, str]:
        return {
            "KSWEEP_HOST": HOST,
            "KSWEEP_PORT": str(self.ports["api"]),
            "KSWEEP_DATABASE_URL": self.pg_url(SERVICE_DB, "postgresql+psycopg", password=True),
            "KSWEEP_LAUNCHER": "ray",
            "KSWEEP_RAY_JOBS_URL": self.url("ray-dashboard"),
            "KSWEEP_SWEEP_ROOT": str(self.layout.sweeps),
            "KSWEEP_API_TOKENS": f"cluster:{self.layout.api_token.read_text().strip()}",
            "MLFLOW_TRACKING_URI": self.url("mlflow"),
            "KSWEEP_MLFLOW_UI_URL": self.url("mlflow"),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.layout.ray_token),
            "RAY_AUTH_TOKEN": self.layout.ray_token.read_text().strip(),
            "PGPASSFILE": str(self.layout.pgpass),
        }

    def start_api(self) -> Proc:
        ksweep = Path(sys.executable).parent / "ksweep"
        argv = [str(ksweep), "serve"] if ksweep.exists() else [sys.executable, "-m", "service.cli",
                                                                "serve"]
        return self.record(spawn("api", argv, env=self.env(**self.api_environment()),
                                 cwd=self.layout.root,
                                 log=self.layout.logs / "api.log"))

    def ray_api(self, path: str, method: str = "GET", timeout: float = 3) -> object:
        """JSON from the Ray dashboard (None when it does not answer)."""
        request = urllib.request.Request(f"{self.url('ray-dashboard')}{path}", method=method,
                                         headers=self.ray_headers())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.load(response)
        except (OSError, ValueError):
            return None

    def ray_alive_nodes(self) -> int:
        body = self.ray_api("/nodes?view=summary")
        summary = body.get("data", {}).get("summary", []) if isinstance(body, dict) else []
        return sum(1 for node in summary if node.get("raylet", {}).get("state") == "ALIVE")

    def stop_ray_jobs(self) -> None:
        """Stop the jobs still running: a node with a busy job outlives SIGTERM by many seconds."""
        def running() -> list[str]:
            try:
                jobs = self.ray_api("/api/jobs/")
            except OSError:  # no token file: nothing we can ask
                return []
            return [job["submission_id"] for job in (jobs if isinstance(jobs, list) else [])
                    if job.get("status") in ("PENDING", "RUNNING") and job.get("submission_id")]

        jobs = running()
        for job_id in jobs:
            log(f"stopping Ray Job {job_id}")
            self.ray_api(f"/api/jobs/{job_id}/stop", method="POST", timeout=10)
        deadline = time.monotonic() + 10  # Ray SIGKILLs a driver 3s after its SIGTERM
        while jobs and running() and time.monotonic() < deadline:
            time.sleep(0.5)

    def up(self, with_api: bool) -> None:
        timed: dict[str, float] = {}
        began = time.monotonic()
        self.prepare()
        self.state["parts"] = [part for part in PARTS if with_api or part != "api"]
        self.save()
        self.start_postgres()
        timed["postgres"] = time.monotonic() - began
        # MLflow's first start migrates its schema and Ray takes a while: start both, then wait.
        mlflow = self.start_mlflow()
        head = self.start_ray_head()
        jobs_api = f"{self.url('ray-dashboard')}/api/jobs/"
        wait_until(head, lambda: http_ok(jobs_api, self.ray_headers()), what="Jobs API",
                   timeout=self.timeout())
        timed["ray-head"] = time.monotonic() - began
        worker = self.start_ray_worker()
        wait_until(mlflow, lambda: http_ok(f"{self.url('mlflow')}/health"), what="/health",
                   timeout=self.timeout())
        timed["mlflow"] = time.monotonic() - began
        wait_until(worker, lambda: self.ray_alive_nodes() >= 2, what="second alive Ray node",
                   timeout=self.timeout())
        timed["ray-worker"] = time.monotonic() - began
        # The API's environment, also for running `ksweep serve` by hand (`up --no-api`).
        write_secret(self.layout.api_env, "".join(
            f"{key}={value}\n" for key, value in self.api_environment().items()))
        if with_api:
            api = self.start_api()
            for path in ("healthz", "readyz"):
                url = f"{self.url('api')}/api/v1/{path}"
                wait_until(api, lambda url=url: http_ok(url), what=f"200 from /api/v1/{path}",
                           timeout=self.timeout())
            timed["api"] = time.monotonic() - began
        log("healthy after " + ", ".join(f"{part} {seconds:.1f}s" for part, seconds in timed.items()))

    # --- status ------------------------------------------------------------------------------

    def lines(self) -> list[tuple[str, str]]:
        layout = self.layout
        lines = []
        if "api" in self.state.get("parts", PARTS):
            lines.append(("api", self.url("api")))
        lines += [
            ("mlflow", self.url("mlflow")),
            ("ray-dashboard", self.url("ray-dashboard")),
            ("postgres", f"postgresql://{PG_ROLE}@{HOST}:{self.ports['postgres']}/{SERVICE_DB}"),
            ("postgres-passfile", str(layout.pgpass)),
            ("api-token-file", str(layout.api_token)),
            ("ray-auth-token-file", str(layout.ray_token)),
        ]
        return lines

    def unhealthy(self) -> list[str]:
        """Parts whose process is gone or that fail their health check."""
        by_name = {proc.name: proc for proc in self.procs()}
        checks = {
            "postgres": lambda: port_open(self.ports["postgres"]),
            "mlflow": lambda: http_ok(f"{self.url('mlflow')}/health"),
            "ray-head": lambda: http_ok(f"{self.url('ray-dashboard')}/api/jobs/", self.ray_headers()),
            "ray-worker": lambda: self.ray_alive_nodes() >= 2,
            "api": lambda: http_ok(f"{self.url('api')}/api/v1/healthz"),
        }
        bad = []
        for part in self.state.get("parts", PARTS):
            proc = by_name.get(part)
            if proc is None or not proc.alive() or not checks[part]():
                bad.append(part)
        return bad

    def print_status(self) -> None:
        for name, value in self.lines():
            print(f"{name}: {value}")
        sys.stdout.flush()

    # --- down --------------------------------------------------------------------------------

    def down(self) -> None:
        began = time.monotonic()
        by_name = {proc.name: proc for proc in self.procs()}
        for stage in STOP_STAGES:
            procs = [by_name[name] for name in stage if name in by_name and by_name[name].alive()]
            if not procs:
                continue
            if "ray-head" in by_name and by_name["ray-head"] in procs:
                self.stop_ray_jobs()
            stopping = time.monotonic()
            # Postgres: SIGINT is its fast shutdown (SIGTERM waits for clients to leave).
            # `ray start --block` stops its node's daemons on SIGTERM.
            killed = stop([(proc, signal.SIGINT if proc.name == "postgres" else signal.SIGTERM)
                           for proc in procs])
            log(f"stopped {', '.join(proc.name for proc in procs)} in "
                f"{time.monotonic() - stopping:.1f}s"
                + (f" (killed {', '.join(killed)}: still running after the grace period)"
                   if killed else ""))
        leftovers = stop_marked(self.state["marker"]) if self.state.get("marker") else []
        if leftovers:
            log(f"stopped {len(leftovers)} leftover process(es) of this cluster: {leftovers}")
        run_dir = Path(self.state.get("run_dir", ""))
        if run_dir.name.startswith("ksw-") and run_dir.is_dir():
            ray_logs = run_dir / "ray" / "session_latest" / "logs"
            if ray_logs.is_dir():
                with contextlib.suppress(OSError, shutil.Error):
                    shutil.copytree(ray_logs, self.layout.logs / "ray", dirs_exist_ok=True)
            shutil.rmtree(run_dir, ignore_errors=True)
        self.layout.run_link.unlink(missing_ok=True)
        for path in self.layout.secrets():
            path.unlink(missing_ok=True)
        self.layout.state_file.unlink(missing_ok=True)
        self.state = {}
        log(f"down in {time.monotonic() - began:.1f}s (logs kept in {self.layout.logs})")


@contextlib.contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """One `up`/`down`/`status` at a time per state directory."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cmd_up(cluster: Cluster, with_api: bool) -> int:
    if cluster.load():
        alive = [proc.name for proc in cluster.procs() if proc.alive()]
        if alive and not cluster.unhealthy():
            log(f"already up ({cluster.layout.root})")
            cluster.print_status()
            return 0
        if alive:
            log(f"partly up (running: {', '.join(alive)}; unhealthy: "
                f"{', '.join(cluster.unhealthy())}); run `scripts/local-cluster down` first")
            return 1
        log("clearing the state of a cluster that is no longer running")
        cluster.down()
    try:
        cluster.up(with_api)
    except (ClusterError, KeyboardInterrupt) as exc:
        log(f"up failed: {exc}" if isinstance(exc, ClusterError) else "interrupted")
        log("stopping what was started")
        cluster.down()
        return 1
    cluster.print_status()
    return 0


def cmd_status(cluster: Cluster) -> int:
    if not cluster.load():
        log(f"not running (no state in {cluster.layout.root})")
        return 1
    cluster.print_status()
    bad = cluster.unhealthy()
    if bad:
        log(f"not healthy: {', '.join(bad)}")
        return 1
    return 0


def cmd_down(cluster: Cluster) -> int:
    if not cluster.load():
        log(f"not running (no state in {cluster.layout.root})")
        return 0
    cluster.down()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/local-cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--no-api", action="store_true",
                        help="up: start everything but the API (its environment is written to "
                        "<state>/api.env, to run `ksweep serve` yourself)")
    parser.add_argument("--dir", type=Path,
                        default=Path(os.environ.get("KSWEEP_CLUSTER_DIR", ".ksweep/cluster")),
                        help="state directory (default: $KSWEEP_CLUSTER_DIR or ./.ksweep/cluster)")
    args = parser.parse_args(argv)
    layout = Layout(args.dir)
    cluster = Cluster(layout)
    with locked(layout):
        if args.command == "up":
            return cmd_up(cluster, with_api=not args.no_api)
        if args.command == "status":
            return cmd_status(cluster)
        return cmd_down(cluster)


if __name__ == "__main__":
    sys.exit(main())

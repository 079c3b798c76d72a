"""Starting the parts of a local cluster (Postgres, MLflow, a Ray head and worker, the API)
and the state they are recorded in; :class:`local_cluster.Cluster` adds up, status and down."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from cluster_layout import (
    HOST,
    MLFLOW_DB,
    OBJECT_STORE_BYTES,
    PG_ROLE,
    SCRUBBED_ENV,
    SERVICE_DB,
    Layout,
    postgres_bin,
    venv_tool,
    write_secret,
)
from cluster_processes import (
    MARKER_ENV,
    ClusterError,
    Proc,
    free_ports,
    run_checked,
    spawn,
    wait_until,
)
from script_settings import script_settings


class ClusterParts:
    """One local cluster's state file and how each of its parts starts."""

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
        return script_settings().cluster_timeout

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
        argv = [str(ksweep), "serve"] if ksweep.exists() else [sys.executable, "-m", "ksweep.cli",
                                                                "serve"]
        return self.record(spawn("api", argv, env=self.env(**self.api_environment()),
                                 cwd=self.layout.root,
                                 log=self.layout.logs / "api.log"))


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
import json
import shutil
import signal
import sys
import time
import urllib.request
from pathlib import Path

from cluster_layout import (
    HOST,
    PARTS,
    PG_ROLE,
    SERVICE_DB,
    STOP_STAGES,
    Layout,
    locked,
    log,
    write_secret,
)
from cluster_parts import ClusterParts
from cluster_processes import (
    ClusterError,
    http_ok,
    port_open,
    stop,
    stop_marked,
    wait_until,
)
from script_settings import script_settings


class Cluster(ClusterParts):
    """One local cluster: its parts (:class:`ClusterParts`), and checking and stopping them."""

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
                        default=script_settings().cluster_dir,
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

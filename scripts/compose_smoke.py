"""scripts/compose-smoke: the docker-compose cluster, built and run for real.

    scripts/compose-smoke [--local-bases | --hub-bases] [--keep] [--timeout SECONDS]

Starts a Docker engine when none answers (and this is root), builds the images, brings the
stack up (``docker compose up -d --wait``), submits scripts/compose_smoke_spec.yaml over REST
to the api container, waits for it to succeed and checks: the sweep ran as a Ray Job whose
driver is on the head, its trials ran on ray-worker containers, and MLflow holds the parent
run and one finished child per trial. Then it scales ray-worker to 2, runs the sweep again and
checks that its trials used both workers. Then it registers a small generated dataset over REST
(``POST /api/v1/datasets``, a Parquet body), runs scripts/compose_smoke_dataset_spec.yaml on it
and checks that its trials ran on ray-worker containers and that every trial's MLflow run
carries the dataset input (digest = the hash's first 32 hex characters) and the
``dataset_sha256`` param equal to the registered hash. Then the cluster's faults, each with a
sweep on two workers (scripts/cluster_faults.py: a worker node killed, the head restarted,
a worker cut off from the network for 40 s; ``--no-faults`` skips them). Then
``docker compose down -v`` and a check that no container, volume or network of the project is
left. The last line is the outcome and the wall time. ``--local-bases`` (the default when Docker Hub cannot be reached) builds on a
Debian base made here and runs Postgres and S3 stand-ins (docker/compose.standins.yml).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from compose_engine import (  # noqa: E402
    REPO,
    Engine,
    SmokeError,
    build_images,
    compose_command,
    hub_reachable,
    log,
    run,
)
from script_settings import script_settings  # noqa: E402

from examples.dataset.make_dataset import stories  # noqa: E402  (pyarrow only)
from workers.contract import (  # noqa: E402  (torch-free)
    DATASET_DIGEST_CHARS,
    DATASET_SHA256_PARAM,
    RUN_KIND_TAG,
    RUN_KIND_TRIAL,
    TRIAL_ID_TAG,
)

PROJECT = "ksweep-smoke"
SPEC = REPO / "scripts" / "compose_smoke_spec.yaml"
DATASET_SPEC = REPO / "scripts" / "compose_smoke_dataset_spec.yaml"
DATASET_ROWS = 300
TORCH_VERSION = "2.13.0"
IMAGES = [("kappa-sweep:dev", "docker/kappa-sweep/Dockerfile"),
          ("kappa-sweep-mlflow:dev", "docker/mlflow/Dockerfile")]
STANDIN = ("kappa-sweep-standin:dev", "docker/standins/Dockerfile")
TERMINAL = ("succeeded", "failed", "cancelled")


class Stack:
    """``docker compose`` of this run: its project name, files and environment."""

    def __init__(self, local_bases: bool) -> None:
        self.cmd = compose_command() + ["--project-name", PROJECT, "-f", "docker-compose.yml"]
        if local_bases:
            self.cmd += ["-f", "docker/compose.standins.yml"]
        self.cmd += ["-f", "docker/compose.smoke.yml"]
        self.api_token = script_settings().smoke_api_token or secrets.token_hex(16)
        self.ray_token = os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32)
        # Interpolated into the compose files; nothing else of the caller's .env applies.
        self.env = {**os.environ, "KSWEEP_API_TOKENS": f"admin:{self.api_token}",
                    "RAY_AUTH_TOKEN": self.ray_token}

    def __call__(self, *args: str, timeout: float = 300, capture: bool = False, check: bool = True):
        return run([*self.cmd, *args], timeout=timeout, capture=capture, check=check, env=self.env,
                   cwd=REPO)

    def url(self, service: str, port: int) -> str:
        out = self("port", service, str(port), capture=True, timeout=30).stdout.split()
        if not out:
            raise SmokeError(f"{service} publishes no port {port} (is it running?)")
        return f"http://{out[-1]}"

    def check_running(self) -> None:
        """Every service but the one-shot bucket job is running (and healthy, with a check)."""
        rows = [json.loads(line) for line in
                self("ps", "-a", "--format", "json", capture=True, timeout=30).stdout.splitlines() if line]
        bad = [f"{r['Service']}: {r['Status']}" for r in rows if r["Service"] != "minio-buckets"
               and (r["State"] != "running" or r.get("Health") not in ("", "healthy"))]
        if bad:
            raise SmokeError(f"after `up --wait`: {bad}")

    def container_ips(self, service: str) -> set[str]:
        ids = self("ps", "-q", service, capture=True, timeout=30).stdout.split()
        out = run(["docker", "inspect", "--format",
                   "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", *ids],
                  timeout=30, capture=True).stdout
        return set(out.split())


def http(method: str, url: str, token: str | None = None, body: Any = None,
         timeout: float = 30) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        raise SmokeError(f"{method} {url}: HTTP {error.code}: {error.read()[:2000]!r}") from None


def upload_dataset(api: str, token: str, name: str, rows: int) -> dict[str, Any]:
    """Register a generated table (labels, groups) as ``name``: one Parquet file, raw body."""
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(stories(rows, seed=0), buffer)
    request = urllib.request.Request(
        f"{api}/api/v1/datasets?name={name}&filename=smoke-stories.parquet", data=buffer.getvalue(),
        method="POST", headers={"Content-Type": "application/vnd.apache.parquet",
                                "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise SmokeError(f"POST /api/v1/datasets?name={name}: HTTP {error.code}: "
                         f"{error.read()[:2000]!r}") from None


def ray_state(head: str, token: str, resource: str) -> list[dict[str, Any]]:
    """Rows of Ray's State API (``/api/v0/nodes``, ``/api/v0/actors``) on the head."""
    data = http("GET", f"{head}/api/v0/{resource}?limit=10000&detail=true", token)
    result = data.get("data", {}).get("result", {})
    return result.get("result", result) if isinstance(result, dict) else result


def wait_for(what: str, check, timeout: float, every: float = 3.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SmokeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def alive_worker_ips(stack: Stack, head: str) -> set[str]:
    workers = stack.container_ips("ray-worker")
    nodes = ray_state(head, stack.ray_token, "nodes")
    return {n["node_ip"] for n in nodes if n.get("state") == "ALIVE" and n["node_ip"] in workers}


def run_sweep(stack: Stack, api: str, head: str, mlflow: str, spec: dict[str, Any],
              timeout: float) -> dict[str, Any]:
    """Submit, wait, check the Ray Job, the trial placement and MLflow; returns the figures."""
    start = time.monotonic()
    sweep = http("POST", f"{api}/api/v1/sweeps", stack.api_token, spec)
    sweep_id = sweep["id"]
    log(f"submitted sweep {sweep_id} ({sweep['counters']['total']} trials)")

    def finished():
        current = http("GET", f"{api}/api/v1/sweeps/{sweep_id}", stack.api_token)
        return current if current["state"] in TERMINAL else None

    sweep = wait_for(f"sweep {sweep_id} to finish", finished, timeout)
    wall = time.monotonic() - start
    if sweep["state"] != "succeeded":
        raise SmokeError(f"sweep {sweep_id} ended {sweep['state']}: {sweep.get('error')}")
    total = sweep["counters"]["total"]
    if sweep["counters"]["done"] != total:
        raise SmokeError(f"sweep {sweep_id}: {sweep['counters']} (expected {total} done)")
    handle = sweep["driver"]["handle"] or ""
    if not handle.startswith("ray-job:"):
        raise SmokeError(f"sweep {sweep_id} did not run as a Ray Job (driver handle {handle!r})")
    # The driver records the outcome, then exits: its Ray Job ends a moment later.
    job_url = f"{head}/api/jobs/{handle.removeprefix('ray-job:')}"

    def job_ended():
        job = http("GET", job_url, stack.ray_token)
        return job if job["status"] not in ("PENDING", "RUNNING") else None

    job = wait_for(f"Ray Job {handle} to end", job_ended, 120, every=1)
    nodes = ray_state(head, stack.ray_token, "nodes")
    head_ids = {n["node_id"] for n in nodes if n.get("is_head_node")}
    if job["status"] != "SUCCEEDED" or job.get("driver_node_id") not in head_ids:
        raise SmokeError(f"Ray Job {handle}: status {job['status']}, driver on node "
                         f"{job.get('driver_node_id')} (head: {head_ids})")
    node_ip = {n["node_id"]: n["node_ip"] for n in nodes}
    trial_ips = {node_ip.get(a["node_id"], a["node_id"]) for a in ray_state(head, stack.ray_token, "actors")
                 if a.get("job_id") == job["job_id"] and a.get("node_id") not in head_ids}
    worker_ips = stack.container_ips("ray-worker")
    if not trial_ips or not trial_ips <= worker_ips:
        raise SmokeError(f"sweep {sweep_id}: trial actors on {trial_ips or 'no node'}, "
                         f"ray-worker containers are {worker_ips}")
    children = check_mlflow(mlflow, sweep, total)
    return {"id": sweep_id, "trials": total, "wall_s": wall, "trial_nodes": trial_ips,
            "runs": children}


def check_mlflow(mlflow: str, sweep: dict[str, Any], total: int) -> list[dict[str, Any]]:
    """The parent run, and exactly one FINISHED child run per trial, on the MLflow server;
    returns the child runs."""
    links = sweep["mlflow"]
    parent_id = links["parent_run_id"]
    parent = http("GET", f"{mlflow}/api/2.0/mlflow/runs/get?run_id={parent_id}")["run"]
    if parent["info"]["status"] != "FINISHED":
        raise SmokeError(f"MLflow parent run {parent_id} is {parent['info']['status']}")
    found = http("POST", f"{mlflow}/api/2.0/mlflow/runs/search", body={
        "experiment_ids": [links["experiment_id"]], "max_results": 1000,
        "filter": f"tags.mlflow.parentRunId = '{parent_id}' and tags.`{RUN_KIND_TAG}` = '{RUN_KIND_TRIAL}'"})
    children = found.get("runs", [])
    trials = [{t["key"]: t["value"] for t in r["data"].get("tags", [])}.get(TRIAL_ID_TAG)
              for r in children]
    states = {r["info"]["status"] for r in children}
    if len(children) != total or len(set(trials)) != total or states != {"FINISHED"}:
        raise SmokeError(f"MLflow: {len(children)} child runs of {parent_id} for {len(set(trials))} "
                         f"trials, states {states} (expected {total} FINISHED, one per trial)")
    return children


def check_dataset_runs(mlflow: str, runs: list[dict[str, Any]], name: str, sha256: str) -> None:
    """Every trial run records the registered dataset: the ``dataset_sha256`` param is its full
    hash and its MLflow dataset input is ``name`` with the hash's first 32 hex characters."""
    for listed in runs:
        run_id = listed["info"]["run_id"]
        found = http("GET", f"{mlflow}/api/2.0/mlflow/runs/get?run_id={run_id}")["run"]
        params = {p["key"]: p["value"] for p in found["data"].get("params", [])}
        inputs = [(d["dataset"]["name"], d["dataset"]["digest"])
                  for d in found.get("inputs", {}).get("dataset_inputs", [])]
        if params.get(DATASET_SHA256_PARAM) != sha256 \
                or (name, sha256[:DATASET_DIGEST_CHARS]) not in inputs:
            raise SmokeError(f"MLflow run {run_id}: {DATASET_SHA256_PARAM} = "
                             f"{params.get(DATASET_SHA256_PARAM)!r}, dataset inputs {inputs} "
                             f"(expected {name!r} with hash {sha256})")


def dataset_sweep(stack: Stack, api: str, head: str, mlflow: str) -> dict[str, Any]:
    """Register a dataset over REST, sweep on it on the workers, check the runs' dataset."""
    spec = yaml.safe_load(DATASET_SPEC.read_text())
    name = spec["template"]["data"]["dataset"]
    record = upload_dataset(api, stack.api_token, name, DATASET_ROWS)
    if record["name"] != name or record["rows"] != DATASET_ROWS:
        raise SmokeError(f"registered {record.get('name')!r} with {record.get('rows')} rows, "
                         f"expected {name!r} with {DATASET_ROWS}")
    listed = http("GET", f"{api}/api/v1/datasets/{name}", stack.api_token)
    if listed["sha256"] != record["sha256"]:
        raise SmokeError(f"GET /api/v1/datasets/{name}: sha256 {listed['sha256']}, "
                         f"registered {record['sha256']}")
    log(f"registered dataset {name!r} ({DATASET_ROWS} rows, sha256 {record['sha256'][:12]})")
    result = run_sweep(stack, api, head, mlflow, spec, timeout=900)
    check_dataset_runs(mlflow, result["runs"], name, record["sha256"])
    return result


def rounded(value: Any) -> Any:
    """Figures for the last line: seconds to the second, nested dicts included."""
    if isinstance(value, float):
        return round(value)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def leftovers() -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    left = []
    for kind in (["ps", "-a"], ["volume", "ls"], ["network", "ls"]):
        out = run(["docker", *kind, "-q", "--filter", label], timeout=30, capture=True).stdout.split()
        left += [f"{kind[0]} {x}" for x in out]
    return left


def smoke(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    local = args.local_bases if args.local_bases is not None else not hub_reachable()
    log(f"bases: {'local (debootstrap + stand-ins)' if local else 'Docker Hub'}")
    stack = Stack(local)
    t = time.monotonic()
    images = IMAGES + ([STANDIN] if local else [])
    figures["build_s"] = build_images(images, local_bases=local, torch_version=TORCH_VERSION,
                                      timeout=args.timeout)
    figures["build_total_s"] = time.monotonic() - t
    try:
        t = time.monotonic()
        stack("up", "-d", "--wait", "--no-build", "--wait-timeout", "600", timeout=700)
        figures["up_s"] = time.monotonic() - t
        # Compose v2.40 can exit 0 from `up --wait` when a dependency ended unhealthy.
        stack.check_running()
        api, head, mlflow = stack.url("api", 8000), stack.url("ray-head", 8265), stack.url("mlflow", 5000)
        wait_for("the ray-worker to join", lambda: alive_worker_ips(stack, head), 120)
        spec = yaml.safe_load(SPEC.read_text())
        first = run_sweep(stack, api, head, mlflow, spec, timeout=900)
        log(f"sweep 1 succeeded in {first['wall_s']:.0f} s, trials on {sorted(first['trial_nodes'])}")
        t = time.monotonic()
        stack("up", "-d", "--wait", "--no-build", "--scale", "ray-worker=2", timeout=400)
        wait_for("two ray-workers", lambda: len(alive_worker_ips(stack, head)) == 2, 180)
        figures["scale_s"] = time.monotonic() - t
        second = run_sweep(stack, api, head, mlflow, spec, timeout=900)
        if len(second["trial_nodes"]) != 2:
            raise SmokeError(f"sweep 2 ran its trials on {second['trial_nodes']}, not both workers")
        log(f"sweep 2 succeeded in {second['wall_s']:.0f} s, trials on {sorted(second['trial_nodes'])}")
        third = dataset_sweep(stack, api, head, mlflow)
        log(f"dataset sweep succeeded in {third['wall_s']:.0f} s, trials on "
            f"{sorted(third['trial_nodes'])}")
        figures["sweep_s"] = [round(first["wall_s"]), round(second["wall_s"]),
                              round(third["wall_s"])]
        if args.faults:
            from cluster_faults import IN_SMOKE, run_faults  # it imports this module

            t = time.monotonic()
            figures["faults"] = run_faults(stack, IN_SMOKE)
            figures["faults_s"] = time.monotonic() - t
    except BaseException:
        stack("ps", "-a", check=False, timeout=60)
        stack("logs", "--no-color", "--tail=60", check=False, timeout=120)
        raise
    finally:
        if args.keep:
            log(f"--keep: the stack stays up (docker compose -p {PROJECT} down -v)")
        else:
            t = time.monotonic()
            stack("down", "-v", "--remove-orphans", "--timeout", "30", timeout=300, check=False)
            figures["down_s"] = time.monotonic() - t
    if not args.keep and (left := leftovers()):
        raise SmokeError(f"left after `down -v`: {left}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bases = parser.add_mutually_exclusive_group()
    bases.add_argument("--local-bases", dest="local_bases", action="store_true", default=None,
                       help="build on a local Debian base and run the Postgres/S3 stand-ins")
    bases.add_argument("--hub-bases", dest="local_bases", action="store_false",
                       help="build on python:3.11-slim and run the real Postgres and MinIO images")
    parser.add_argument("--keep", action="store_true", help="leave the stack up at the end")
    parser.add_argument("--no-faults", dest="faults", action="store_false",
                        help="skip the cluster faults (scripts/cluster_faults.py) after the sweeps")
    parser.add_argument("--timeout", type=float, default=2400, help="limit per image build (s)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    figures: dict[str, Any] = {}
    outcome, code = "PASSED", 0
    try:
        with Engine():
            smoke(args, figures)
    except SmokeError as error:
        print(f"compose-smoke: {error}", file=sys.stderr, flush=True)
        outcome, code = "FAILED", 1
    except KeyboardInterrupt:
        outcome, code = "INTERRUPTED", 130
    except Exception as error:  # noqa: BLE001 - a bug or an unexpected answer: still the one last line
        print(f"compose-smoke: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        outcome, code = "FAILED", 1
    summary = json.dumps(rounded(figures))
    print(f"compose-smoke: {outcome} in {time.monotonic() - start:.0f} s {summary}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

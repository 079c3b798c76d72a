"""What scripts/cluster_faults.py asks of the compose cluster: the stack's addresses, the sweep's
trials, Ray's nodes and actors, and the count of a finished sweep's MLflow runs."""

from __future__ import annotations

import json
import sys
import time
from http.client import HTTPException
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from compose_engine import REPO, SmokeError, log, run  # noqa: E402
from compose_smoke import Stack, alive_worker_ips, http, ray_state, wait_for  # noqa: E402

from workers.contract import RUN_KIND_TAG, RUN_KIND_TRIAL, TRIAL_ID_TAG, VAL_LOSS  # noqa: E402

SPEC = REPO / "scripts" / "cluster_faults_spec.yaml"
SWEEP_TIMEOUT_S = 900.0
# What a request to a service that is restarting may raise (refused, reset, cut short, 5xx).
BLIPS = (SmokeError, OSError, ValueError, HTTPException)


class Cluster:
    """The running stack's addresses (the head's published port changes when it restarts)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.api, self.mlflow = stack.url("api", 8000), stack.url("mlflow", 5000)
        self.head = stack.url("ray-head", 8265)

    def refresh_head(self) -> None:
        self.head = self.stack.url("ray-head", 8265)

    def get(self, path: str, timeout: float = 30) -> Any:
        return http("GET", f"{self.api}/api/v1{path}", self.stack.api_token, timeout=timeout)

    def trials(self, sweep_id: str) -> list[dict[str, Any]]:
        return self.get(f"/sweeps/{sweep_id}/trials?limit=500")["items"]

    def workers(self) -> dict[str, str]:
        """ray-worker container id -> its IP."""
        ids = self.stack("ps", "-q", "ray-worker", capture=True, timeout=30).stdout.split()
        out = {}
        for cid in ids:
            ip = run(["docker", "inspect", "--format",
                      "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", cid],
                     timeout=30, capture=True).stdout.split()
            out[cid] = ip[0] if ip else ""
        return out

    def nodes(self) -> list[dict[str, Any]]:
        return ray_state(self.head, self.stack.ray_token, "nodes")

    def job_actor_nodes(self, sweep_id: str) -> dict[str, str]:
        """Node id -> state of the actors of the sweep's current Ray Job (its trials)."""
        handle = self.get(f"/sweeps/{sweep_id}")["driver"]["handle"] or ""
        job = http("GET", f"{self.head}/api/jobs/{handle.removeprefix('ray-job:')}",
                   self.stack.ray_token)
        out: dict[str, str] = {}
        for actor in ray_state(self.head, self.stack.ray_token, "actors"):
            node = actor.get("node_id")
            if actor.get("job_id") == job.get("job_id") and node and out.get(node) != "ALIVE":
                out[node] = actor.get("state", "")
        return out


def submit(cluster: Cluster) -> str:
    spec = yaml.safe_load(SPEC.read_text())
    sweep = http("POST", f"{cluster.api}/api/v1/sweeps", cluster.stack.api_token, spec)
    log(f"submitted sweep {sweep['id']} ({sweep['counters']['total']} trials)")
    return sweep["id"]


def wait_trials(cluster: Cluster, sweep_id: str, running: int, done: int = 0,
                timeout: float = 600) -> dict[str, int]:
    """Until ``running`` trials run with a checkpoint (an epoch done) and ``done`` have ended;
    returns the running trials' epochs."""
    def check():
        items = cluster.trials(sweep_id)
        going = {t["trial_id"]: t["epochs"] for t in items if t["state"] == "running" and t["epochs"] >= 1}
        finished = sum(t["state"] == "done" for t in items)
        return going if len(going) >= running and finished >= done else None

    return wait_for(f"{running} trials of {sweep_id} running past an epoch, {done} done", check,
                    timeout, every=1)


def wait_recovered(cluster: Cluster, sweep_id: str, at_fault: dict[str, int], start: float) -> float:
    """Seconds from ``start`` until every trial running at the fault logged a newer epoch or ended."""
    def check():
        try:
            now = {t["trial_id"]: t for t in cluster.trials(sweep_id)}
        except BLIPS:  # the api is up throughout; a blip is retried
            return None
        return all(now[t]["state"] in ("done", "failed", "stopped") or now[t]["epochs"] > e
                   for t, e in at_fault.items())

    wait_for(f"the trials of {sweep_id} running at the fault to go on", check, 600, every=1)
    return time.monotonic() - start


def wait_node_dead(cluster: Cluster, node_id: str, start: float, timeout: float = 180) -> float:
    def dead():
        try:
            nodes = {n["node_id"]: n.get("state") for n in cluster.nodes()}
        except BLIPS:
            return False
        return nodes.get(node_id) == "DEAD"

    wait_for(f"Ray to mark node {node_id[:12]} dead", dead, timeout, every=1)
    return time.monotonic() - start


def victim(cluster: Cluster, sweep_id: str) -> tuple[str, str, str]:
    """A ray-worker container running one of the sweep's trials: (container, IP, node id)."""
    alive = {n["node_ip"]: n["node_id"] for n in cluster.nodes() if n.get("state") == "ALIVE"}
    busy = {node for node, state in cluster.job_actor_nodes(sweep_id).items() if state == "ALIVE"}
    for cid, ip in sorted(cluster.workers().items()):
        if alive.get(ip) in busy:
            return cid, ip, alive[ip]
    raise SmokeError(f"sweep {sweep_id}: no ray-worker runs an actor of its job ({busy})")


def finish_and_count(cluster: Cluster, sweep_id: str, epochs: int) -> dict[str, Any]:
    """Wait for the sweep to end; the runs counted and the retried trials. Raises (after
    logging the figures) when a guarantee fails."""
    def finished():
        current = cluster.get(f"/sweeps/{sweep_id}")
        return current if current["state"] in ("succeeded", "failed", "cancelled") else None

    sweep = wait_for(f"sweep {sweep_id} to finish", finished, SWEEP_TIMEOUT_S)
    total = sweep["counters"]["total"]
    links = sweep["mlflow"]
    found = http("POST", f"{cluster.mlflow}/api/2.0/mlflow/runs/search", body={
        "experiment_ids": [links["experiment_id"]], "max_results": 1000,
        "filter": f"tags.mlflow.parentRunId = '{links['parent_run_id']}' and "
                  f"tags.`{RUN_KIND_TAG}` = '{RUN_KIND_TRIAL}'"})
    runs = found.get("runs", [])
    trial_of = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])}
                .get(TRIAL_ID_TAG) for r in runs}
    parent = http("GET", f"{cluster.mlflow}/api/2.0/mlflow/runs/get?run_id={links['parent_run_id']}")
    twice = []
    for run_id in trial_of:
        history = http("GET", f"{cluster.mlflow}/api/2.0/mlflow/metrics/get-history?run_id={run_id}"
                              f"&metric_key={VAL_LOSS}&max_results=1000").get("metrics", [])
        steps = [m["step"] for m in history]
        if len(steps) != len(set(steps)) or len(steps) != epochs:
            when = sorted((m["step"], m["timestamp"] / 1000) for m in history)
            twice.append(f"{trial_of[run_id]}: (step, logged at) {when}")
    retried = retried_trials(cluster, sweep_id)
    counted = {"state": sweep["state"], "trials": total, "runs": len(runs),
               "lost": total - len(set(trial_of.values())),
               "duplicated": len(runs) - len(set(trial_of.values())),
               "left_running": sum(r["info"]["status"] == "RUNNING" for r in runs)
               + (parent["run"]["info"]["status"] == "RUNNING"),
               "epochs_not_once": len(twice), "retried": retried,
               "driver": sweep["driver"]}
    log(f"sweep {sweep_id}: {json.dumps(counted)}")
    if sweep["state"] != "succeeded" or sweep["counters"]["done"] != total:
        raise SmokeError(f"sweep {sweep_id} ended {sweep['state']} ({sweep['counters']}): "
                         f"{sweep.get('error')}")
    bad = {k: counted[k] for k in ("lost", "duplicated", "left_running", "epochs_not_once") if counted[k]}
    if bad or {r["info"]["status"] for r in runs} != {"FINISHED"}:
        raise SmokeError(f"sweep {sweep_id}: MLflow runs {bad}; {twice}")
    return counted


def retried_trials(cluster: Cluster, sweep_id: str) -> int:
    """Trial folders of the sweep in which Tune recorded a failure (``error.txt``)."""
    out = cluster.stack("exec", "-T", "ray-head", "find", f"/data/ksweep/{sweep_id}", "-name",
                        "error.txt", capture=True, timeout=60, check=False).stdout.split()
    return len({Path(p).parent for p in out})


def ensure_workers(cluster: Cluster, count: int = 2) -> None:
    cluster.stack("up", "-d", "--no-build", "--scale", f"ray-worker={count}", timeout=400, capture=True)
    wait_for(f"{count} ray-workers in the cluster",
             lambda: len(alive_worker_ips(cluster.stack, cluster.head)) == count, 240)


def network_of(container: str) -> str:
    out = run(["docker", "inspect", "--format", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
               container], timeout=30, capture=True).stdout.split()
    if len(out) != 1:
        raise SmokeError(f"container {container[:12]} is on networks {out}, expected one")
    return out[0]


def attach(stack: Stack) -> Stack:
    """Take the tokens of the stack that is up (compose would recreate containers whose
    interpolated environment changed, and the api would refuse another token)."""
    api = stack("ps", "-q", "api", capture=True, timeout=30).stdout.split()
    if not api:
        raise SmokeError("no api container of the project is up: run scripts/compose-smoke --keep first")
    env = dict(line.split("=", 1) for line in run(
        ["docker", "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", api[0]],
        timeout=30, capture=True).stdout.splitlines() if "=" in line)
    stack.api_token = env["KSWEEP_API_TOKENS"].split(",")[0].split(":", 1)[1]
    stack.ray_token = env["RAY_AUTH_TOKEN"]
    stack.env.update(KSWEEP_API_TOKENS=env["KSWEEP_API_TOKENS"], RAY_AUTH_TOKEN=stack.ray_token)
    return stack

"""The compose cluster under a cluster's faults, each once, with a sweep on two ray-workers.

    scripts/compose-smoke               runs these after its own sweeps (--no-faults: not)
    scripts/cluster_faults.py [--only node-loss|head-restart|worker-cut-off]
                                        on the stack `scripts/compose-smoke --keep` left up

Each fault runs scripts/cluster_faults_spec.yaml (8 lone trials of 16 epochs, two at once):

- ``node-loss``: ``docker kill`` of a ray-worker running a trial; ``docker compose up -d
  --scale ray-worker=2`` brings a replacement, which later trials must use.
- ``head-restart``: ``docker restart`` of ray-head once two trials have finished and others
  run. The api sees its driver's health ``unknown`` (``/readyz`` ``degraded``, polled every
  second, never slower than :data:`READYZ_LIMIT_S`), then ``lost``, and starts the driver again
  as a new Ray Job of the same attempt (``<id>-h1``): no restart of the budget spent. The
  finished trials' MLflow runs are left as they were (not re-run).
- ``worker-cut-off``: ``docker network disconnect`` of a ray-worker running a trial for
  :data:`CUT_OFF_S` (longer than the ~30 s Ray takes to give up a node whose pings time out,
  docker-compose.yml), then ``docker network connect``. The node trains on meanwhile; back,
  it learns it was given up and rejoins as a new node (its container restarts). None of its
  metric writes lands after the retried trial's: the write in flight as the network went is
  given up after ``KSWEEP_MLFLOW_WRITE_TIMEOUT_S`` (10 s) on a connection that resets, so TCP
  has nothing to deliver when the network heals, and every later write first finds that the
  retried trial claimed the run (``ksweep.writer``) and is dropped
  (workers/tracking/wire.py, writer.py).

Every fault must end with the sweep succeeded, every trial done, one FINISHED MLflow run per
trial (lost 0, duplicated 0, left RUNNING 0) and each run's ``val/loss`` logged once per epoch.
Each prints one line of figures: seconds to recover (from the fault until every trial that was
running has logged a newer epoch or ended), trials retried (trial folders with Tune's
``error.txt``), the runs counted. Any broken guarantee raises :class:`SmokeError`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from cluster_probe import (  # noqa: E402
    BLIPS,
    SPEC,
    Cluster,
    attach,
    ensure_workers,
    finish_and_count,
    network_of,
    submit,
    victim,
    wait_node_dead,
    wait_recovered,
    wait_trials,
)
from compose_engine import REPO, SmokeError, log, run  # noqa: E402
from compose_smoke import Stack, alive_worker_ips, http, rounded, wait_for  # noqa: E402

FAULTS = ("node-loss", "head-restart", "worker-cut-off")
# What scripts/compose-smoke runs by default (CI): every fault (docs/reliability.md, rows 8-10).
IN_SMOKE = FAULTS
CUT_OFF_S = 40.0  # > the ~30 s to node death: the retried trial runs before the node is back
READYZ_LIMIT_S = 15.0  # /readyz answers within its checks' timeouts (ray_jobs_timeout_s = 10)


def node_loss(cluster: Cluster, epochs: int) -> dict[str, Any]:
    ensure_workers(cluster)
    sweep_id = submit(cluster)
    started = time.monotonic()
    at_fault = wait_trials(cluster, sweep_id, running=2)
    cid, ip, node = victim(cluster, sweep_id)
    before = {n["node_id"] for n in cluster.nodes()}
    log(f"node-loss: docker kill {cid[:12]} ({ip}, node {node[:12]}); trials then {at_fault}")
    t0 = time.monotonic()
    run(["docker", "kill", cid], timeout=60)
    # The replacement is asked for at once, as an orchestrator would (KubeRay recreates a pod).
    replace = subprocess.Popen([*cluster.stack.cmd, "up", "-d", "--no-build", "--scale",
                                "ray-worker=2"], env=cluster.stack.env, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    dead_s = wait_node_dead(cluster, node, t0)
    if replace.wait(timeout=400) != 0:
        raise SmokeError(f"node-loss: docker compose up --scale ray-worker=2 exited {replace.returncode}")
    fresh = wait_for("a replacement ray-worker", lambda: {
        n["node_id"] for n in cluster.nodes()
        if n.get("state") == "ALIVE" and not n.get("is_head_node") and n["node_id"] not in before}, 240)
    replaced_s = time.monotonic() - t0
    recover_s = wait_recovered(cluster, sweep_id, at_fault, t0)
    counted = finish_and_count(cluster, sweep_id, epochs)
    actor_nodes = cluster.job_actor_nodes(sweep_id)
    figures = {"node_dead_s": dead_s, "replacement_s": replaced_s, "recover_s": recover_s,
               "replacement_used": bool(fresh & set(actor_nodes)),
               "sweep_s": time.monotonic() - started, **counted}
    log(f"node-loss: {json.dumps(rounded(figures))}")
    if not figures["replacement_used"]:
        raise SmokeError(f"node-loss: no trial of {sweep_id} ran on the replacement worker "
                         f"{sorted(fresh)} (trials' nodes: {sorted(actor_nodes)})")
    if counted["retried"] < 1:
        raise SmokeError(f"node-loss: no trial of {sweep_id} was retried")
    return figures


class ReadyzWatch(threading.Thread):
    """Polls /readyz every second: the statuses seen, the slowest answer, the unknown drivers."""

    def __init__(self, cluster: Cluster, sweep_id: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.sweep_id = cluster, sweep_id
        self.statuses: dict[str, int] = {}
        self.slowest_s, self.unknown_seen, self.errors = 0.0, False, []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            start = time.monotonic()
            try:
                body = http("GET", f"{self.cluster.api}/api/v1/readyz", timeout=READYZ_LIMIT_S + 15)
                self.statuses[body["status"]] = self.statuses.get(body["status"], 0) + 1
                drivers = body["checks"]["drivers"]
                self.unknown_seen |= not drivers["ok"] and self.sweep_id in drivers["detail"]
            except BLIPS as error:
                self.errors.append(f"{type(error).__name__}: {error}")
            self.slowest_s = max(self.slowest_s, time.monotonic() - start)
            self.done.wait(1.0)


def head_restart(cluster: Cluster, epochs: int) -> dict[str, Any]:
    ensure_workers(cluster)
    sweep_id = submit(cluster)
    started = time.monotonic()
    at_fault = wait_trials(cluster, sweep_id, running=1, done=2)
    finished = {t["trial_id"]: t["mlflow_run_id"] for t in cluster.trials(sweep_id) if t["state"] == "done"}
    ended_at = {rid: http("GET", f"{cluster.mlflow}/api/2.0/mlflow/runs/get?run_id={rid}")
                ["run"]["info"].get("end_time") for rid in finished.values()}
    before = cluster.get(f"/sweeps/{sweep_id}")["driver"]
    head_id = cluster.stack("ps", "-q", "ray-head", capture=True, timeout=30).stdout.split()[0]
    watch = ReadyzWatch(cluster, sweep_id)
    watch.start()
    log(f"head-restart: docker restart {head_id[:12]}; driver {before}; done {sorted(finished)}, "
        f"running {at_fault}")
    t0 = time.monotonic()
    try:
        run(["docker", "restart", head_id], timeout=120)
        restarted_s = time.monotonic() - t0
        cluster.refresh_head()

        def jobs_api_answers() -> bool:
            try:
                return bool(http("GET", f"{cluster.head}/api/version", cluster.stack.ray_token, timeout=5))
            except BLIPS:
                return False

        wait_for("the head's Jobs API to answer", jobs_api_answers, 300, every=1)
        answers_s = time.monotonic() - t0
        driver = wait_for(f"sweep {sweep_id}'s driver started again", lambda: (
            d if (d := cluster.get(f"/sweeps/{sweep_id}")["driver"])["handle"] not in
            (before["handle"], "launching") else None), 300, every=1)
        relaunch_s = time.monotonic() - t0
        wait_for("2 ray-workers back in the cluster",
                 lambda: len(alive_worker_ips(cluster.stack, cluster.head)) == 2, 240)
        rejoin_s = time.monotonic() - t0
        recover_s = wait_recovered(cluster, sweep_id, at_fault, t0)
        wait_for("/readyz ready", lambda: watch.statuses.get("ready", 0) and
                 http("GET", f"{cluster.api}/api/v1/readyz", timeout=READYZ_LIMIT_S)["status"] == "ready",
                 180, every=1)
        ready_s = time.monotonic() - t0
    finally:
        watch.done.set()
        watch.join(timeout=60)
    counted = finish_and_count(cluster, sweep_id, epochs)
    rerun = [rid for rid, end in ended_at.items() if http(
        "GET", f"{cluster.mlflow}/api/2.0/mlflow/runs/get?run_id={rid}")["run"]["info"].get("end_time") != end]
    figures = {"head_restart_s": restarted_s, "jobs_api_back_s": answers_s, "relaunch_s": relaunch_s, "workers_back_s": rejoin_s,
               "recover_s": recover_s, "ready_again_s": ready_s, "readyz": watch.statuses,
               "readyz_slowest_s": watch.slowest_s, "unknown_seen": watch.unknown_seen,
               "driver_after": driver, "resumed": len(at_fault), "finished_before": len(finished),
               "rerun": len(rerun), "sweep_s": time.monotonic() - started, **counted}
    log(f"head-restart: {json.dumps(rounded(figures))}")
    if driver["attempts"] != before["attempts"] or counted["driver"]["attempts"] != before["attempts"]:
        raise SmokeError(f"head-restart: a driver restart was spent ({before} -> {counted['driver']})")
    if not watch.unknown_seen or not watch.statuses.get("degraded") or watch.statuses.get("unready"):
        raise SmokeError(f"head-restart: /readyz said {watch.statuses} (unknown driver seen: "
                         f"{watch.unknown_seen}); expected degraded, never unready")
    if watch.slowest_s > READYZ_LIMIT_S or watch.errors:
        raise SmokeError(f"head-restart: /readyz took up to {watch.slowest_s:.1f} s "
                         f"(limit {READYZ_LIMIT_S:.0f}); errors {watch.errors[:3]}")
    if rerun:
        raise SmokeError(f"head-restart: trials finished before the restart ran again: {rerun}")
    return figures


def worker_cut_off(cluster: Cluster, epochs: int) -> dict[str, Any]:
    ensure_workers(cluster)
    sweep_id = submit(cluster)
    started = time.monotonic()
    at_fault = wait_trials(cluster, sweep_id, running=2)
    cid, ip, node = victim(cluster, sweep_id)
    network = network_of(cid)
    restarts_before = restarts(cid)
    log(f"worker-cut-off: docker network disconnect {network} {cid[:12]} ({ip}, node {node[:12]}) "
        f"for {CUT_OFF_S:.0f} s; trials then {at_fault}")
    t0 = time.monotonic()
    log(f"worker-cut-off: cut at {time.time():.1f} (epoch seconds)")
    run(["docker", "network", "disconnect", network, cid], timeout=60)
    gave_up_s = None
    try:
        dead_s = wait_node_dead(cluster, node, t0)
        while time.monotonic() - t0 < CUT_OFF_S:  # whether the node gives up while cut off
            if gave_up_s is None and restarts(cid) > restarts_before:
                gave_up_s = time.monotonic() - t0
            time.sleep(1)
    finally:
        # A container that restarts meanwhile (its node gave up on the GCS) refuses a connect
        # until it runs again: retried.
        wait_for(f"docker network connect {network} {cid[:12]}", lambda: run(
            ["docker", "network", "connect", "--alias", "ray-worker", network, cid], timeout=60,
            check=False, capture=True).returncode == 0, 120, every=2)
    cut_s = time.monotonic() - t0
    gave_up = "no" if gave_up_s is None else f"at {gave_up_s:.0f} s"
    log(f"worker-cut-off: reconnected at {time.time():.1f}; the node gave up while cut off: {gave_up}")
    wait_for("the cut-off worker back in the cluster (2 ray-workers alive)",
             lambda: len(alive_worker_ips(cluster.stack, cluster.head)) == 2, 240)
    back_s = time.monotonic() - t0
    nodes = {n["node_id"]: n for n in cluster.nodes()}
    rejoined = any(n["node_ip"] == ip and n.get("state") == "ALIVE" and i != node for i, n in nodes.items())
    recover_s = wait_recovered(cluster, sweep_id, at_fault, t0)
    counted = finish_and_count(cluster, sweep_id, epochs)
    figures = {"node_dead_s": dead_s, "node_gave_up_s": gave_up_s, "cut_s": cut_s, "back_s": back_s,
               "rejoined_as_new_node": rejoined, "recover_s": recover_s,
               "sweep_s": time.monotonic() - started, **counted}
    log(f"worker-cut-off: {json.dumps(rounded(figures))}")
    if counted["retried"] < 1:
        raise SmokeError(f"worker-cut-off: no trial of {sweep_id} was retried")
    return figures


def restarts(container: str) -> int:
    """How many times Docker restarted the container (its ``ray start`` exited)."""
    return int(run(["docker", "inspect", "--format", "{{.RestartCount}}", container], timeout=30,
                   capture=True).stdout.strip() or 0)


def run_faults(stack: Stack, only: tuple[str, ...] = FAULTS) -> dict[str, Any]:
    """Each fault once on the running stack; returns the figures of each."""
    cluster = Cluster(stack)
    epochs = yaml.safe_load(SPEC.read_text())["template"]["training"]["epochs"]
    figures: dict[str, Any] = {}
    for name, fault in (("node-loss", node_loss), ("head-restart", head_restart),
                        ("worker-cut-off", worker_cut_off)):
        if name not in only:
            continue
        start = time.monotonic()
        result = fault(cluster, epochs)
        result["fault_total_s"] = time.monotonic() - start
        figures[name] = result
        log(f"{name} PASSED: {json.dumps(rounded(result))}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=FAULTS, help="run only this fault")
    parser.add_argument("--local-bases", action="store_true",
                        help="the stack was started with the stand-ins (compose-smoke --local-bases)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        figures = run_faults(attach(Stack(args.local_bases)), tuple(args.only or FAULTS))
    except SmokeError as error:
        print(f"cluster-faults: FAILED in {time.monotonic() - start:.0f} s: {error}", flush=True)
        return 1
    print(f"cluster-faults: PASSED in {time.monotonic() - start:.0f} s "
          f"{json.dumps(rounded(figures))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

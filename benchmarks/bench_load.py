"""Open-loop load on ``ksweep serve`` with locust: p50/p99 at fixed arrival rates, server CPU per
request, and (for comparison) the queueing of 32 closed-loop clients.

The store is :mod:`benchmarks.bench_service`'s (1,000 sweeps, 10,000 trials, SQLite), the server
a real ``python -m ksweep.cli serve`` under uvicorn on 127.0.0.1 with its queue paused and the
page cache off (``KSWEEP_LIST_CACHE_S=0``: every list request reads the store). Locust runs in
this process as a library (headless, no web UI, ``FastHttpUser``: geventhttpclient, one
keep-alive connection per user), one request shape at a time:

- ``GET /sweeps/{id}`` at 300 requests/s (random seeded ids), goal p99 <= 20 ms and <= 0.4 ms of
  server CPU per request;
- ``GET /sweeps`` (default limit 50) at 100 requests/s, goal p99 <= 20 ms and <= 1.5 ms CPU;
- ``POST /sweeps`` (the quickstart spec, one in four with a fresh Idempotency-Key) at 20/s, goal
  p99 <= 50 ms.

Arrivals are open-loop on a fixed schedule: ``rate x 0.5 s`` users, user ``u``'s ``n``-th request
due at ``phase_u + n x 0.5 s`` (phases uniform over 0.5 s; a custom ``wait_time``), so the arrival
times do not depend on the responses. Locust's ``constant_throughput`` is not used: it counts a
user's start-up sleep as task time, which lines every user's first wait up on the same instant, so
150 users fired in bursts of 150 (measured p50 75 ms at 300/s where the schedule gives 2-4 ms). A
user can only be late when its previous response took over 0.5 s; the report counts those
(``late``) and checks that the achieved rate is within 5 % of the target. Each phase warms up for 2
s, is then measured for ``--duration`` seconds (and at most ``rate x duration x 1.2`` requests),
and the server's CPU time (user + system, all threads, psutil; its child processes too, should it
run uvicorn workers) over the measured window divided by the requests answered is its CPU per
request. The server runs with the service's defaults but those named above (so without the access
log, ``KSWEEP_ACCESS_LOG``); settings in this process's environment reach it. Then 32 users with no
wait (closed loop) send the same shape for the same time: that figure measures queueing on a small
machine, not the server.

``python -m benchmarks.bench_load [--duration S] [--shape NAME ...]``; ``make bench`` runs it
with 8 s per phase in a child process (locust monkey-patches the standard library with gevent).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import gevent
from locust import FastHttpUser, task
from locust.env import Environment

from benchmarks._service_store import QUICKSTART, SEED, TOKENS, seed_store
from benchmarks.bench_service import make_server, process_cpu_s
from sweeps.spec import load_sweep_spec

PACING_S = 0.5          # each open-loop user sends one request every PACING_S seconds
WARMUP_S = 2.0
CLOSED_CLIENTS = 32
RATE_TOLERANCE = 0.05   # the achieved rate must be within 5 % of the target
# shape -> (arrival rate per second, p99 goal in seconds, server CPU goal per request in ms)
SHAPES: dict[str, tuple[float, float, float | None]] = {
    "GET /sweeps/{id}": (300.0, 0.020, 0.4),
    "GET /sweeps": (100.0, 0.020, 1.5),
    "POST /sweeps": (20.0, 0.050, None),
}


@dataclass
class Window:
    """What one measured phase saw."""

    latencies_ms: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    server_cpu_s: float = math.nan
    client_cpu_s: float = math.nan
    load_average: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    recording: bool = False

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return math.nan
        return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]

    @property
    def rate(self) -> float:
        return len(self.latencies_ms) / self.wall_s if self.wall_s else math.nan

    def per_request_ms(self, seconds: float) -> float:
        return seconds / len(self.latencies_ms) * 1e3 if self.latencies_ms else math.nan


def _shape_user(shape: str, host: str, sweep_ids: list[str], body: bytes,
                open_loop: bool) -> type[FastHttpUser]:
    """A locust user class that sends ``shape`` requests: paced (open loop) or back to back."""
    rng = random.Random(SEED)
    owners = [owner for owner in TOKENS if owner != "admin"]
    run = uuid.uuid4().hex[:8]
    counter = iter(range(10**9))

    class ShapeUser(FastHttpUser):
        concurrency = 1  # one connection per user
        _first = 0.0     # when this user's first request was due
        _sent = 0        # requests this user has sent

        def on_start(self) -> None:
            # Open loop: this user's n-th request is due at first + n x PACING_S, whatever the
            # responses; the users' first requests are spread over one pacing interval.
            self._first = time.perf_counter() + rng.uniform(0, PACING_S)
            if open_loop:
                gevent.sleep(max(0.0, self._first - time.perf_counter()))

        def wait_time(self) -> float:
            self._sent += 1
            if not open_loop:
                return 0.0
            return max(0.0, self._first + self._sent * PACING_S - time.perf_counter())

        @task
        def send(self) -> None:
            n = next(counter)
            if shape == "GET /sweeps/{id}":
                self.client.get(f"/sweeps/{rng.choice(sweep_ids)}", name=shape)
            elif shape == "GET /sweeps":
                self.client.get("/sweeps", name=shape)
            else:
                owner = owners[n % len(owners)]
                headers = {"Authorization": f"Bearer {TOKENS[owner]}",
                           "Content-Type": "application/json"}
                if n % 4 == 3:
                    headers["Idempotency-Key"] = f"load-{run}-{n}"
                self.client.post("/sweeps", data=body, headers=headers, name=shape)

    ShapeUser.host = host
    return ShapeUser


def run_phase(user: type[FastHttpUser], users: int, duration_s: float, max_requests: int,
              server_pid: int) -> Window:
    """Start ``users`` users, warm up, then record ``duration_s`` seconds (or ``max_requests``)."""
    window = Window()

    def on_request(request_type: str, name: str, response_time: float, response_length: int,
                   exception: BaseException | None = None, **_: object) -> None:
        if not window.recording:
            return
        if exception is None:
            window.latencies_ms.append(response_time)
        else:
            kind = type(exception).__name__
            window.failures[kind] = window.failures.get(kind, 0) + 1

    env = Environment(user_classes=[user])
    env.events.request.add_listener(on_request)
    runner = env.create_local_runner()
    runner.start(users, spawn_rate=max(users * 4, 1))
    gevent.sleep(WARMUP_S)
    server_cpu, client_cpu = process_cpu_s(server_pid), time.process_time()
    started = time.perf_counter()
    window.recording = True
    deadline = started + duration_s
    while time.perf_counter() < deadline and len(window.latencies_ms) < max_requests:
        gevent.sleep(0.05)
    window.recording = False
    window.wall_s = time.perf_counter() - started
    window.server_cpu_s = process_cpu_s(server_pid) - server_cpu
    window.client_cpu_s = time.process_time() - client_cpu
    window.load_average = os.getloadavg()
    runner.quit()
    return window


def _verdict(value: float, goal: float | None) -> str:
    if goal is None:
        return "(no goal)"
    if value <= goal:
        return f"{value:g} ms <= {goal:g} ms: met"
    return f"{value:g} ms > {goal:g} ms: missed by {value - goal:.2f} ms ({value / goal:.1f}x)"


def report(results: dict[str, tuple[Window, Window]], duration_s: float) -> None:
    print(f"\n== REST service, locust, page cache off: {os.cpu_count()} CPUs shared by the server "
          f"and the load generator, {duration_s:g} s per phase")
    print(f"  {'shape':<18s} {'target/s':>8s} {'got/s':>7s} {'n':>6s} {'p50 ms':>7s} "
          f"{'p99 ms':>7s} {'late':>4s} {'srv CPU ms':>10s} {'gen CPU ms':>10s} {'load1':>5s}")
    for shape, (opened, closed) in results.items():
        rate, p99_goal, cpu_goal = SHAPES[shape]
        late = sum(latency > PACING_S * 1e3 for latency in opened.latencies_ms)
        server_ms = opened.per_request_ms(opened.server_cpu_s)
        print(f"  {shape:<18s} {rate:8.0f} {opened.rate:7.1f} {len(opened.latencies_ms):6d} "
              f"{opened.percentile(50):7.1f} {opened.percentile(99):7.1f} {late:4d} "
              f"{server_ms:10.2f} {opened.per_request_ms(opened.client_cpu_s):10.2f} "
              f"{opened.load_average[0]:5.2f}")
        achieved = "ok" if abs(opened.rate - rate) <= RATE_TOLERANCE * rate else "OFF TARGET"
        print(f"      open loop: achieved rate {achieved}; p99 "
              f"{_verdict(round(opened.percentile(99), 1), p99_goal * 1e3)}; server CPU "
              f"{_verdict(round(server_ms, 2), cpu_goal)}"
              + (f"; failures {opened.failures}" if opened.failures else ""))
        print(f"      closed loop, {CLOSED_CLIENTS} clients (queueing, not a goal): "
              f"{closed.rate:.0f} req/s, p50 {closed.percentile(50):.1f} ms, p99 "
              f"{closed.percentile(99):.1f} ms, server CPU "
              f"{closed.per_request_ms(closed.server_cpu_s):.2f} ms/request"
              + (f"; failures {closed.failures}" if closed.failures else ""))


def main(duration_s: float = 8.0, shapes: list[str] | None = None) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ksweep-bench-load-"))
    server = None
    try:
        sweep_ids = seed_store(f"sqlite:///{folder / 'service.db'}", random.Random(SEED))
        server = make_server(folder)
        server.env["KSWEEP_LIST_CACHE_S"] = "0"
        server.start()
        assert server.process is not None
        pid = server.process.pid
        body = json.dumps(load_sweep_spec(QUICKSTART).model_dump(mode="json")).encode()
        results: dict[str, tuple[Window, Window]] = {}
        for shape in shapes or list(SHAPES):
            rate = SHAPES[shape][0]
            users = max(1, round(rate * PACING_S))
            cap = int(rate * duration_s * 1.2)
            opened = run_phase(_shape_user(shape, server.url, sweep_ids, body, True), users,
                               duration_s, cap, pid)
            closed = run_phase(_shape_user(shape, server.url, sweep_ids, body, False),
                               CLOSED_CLIENTS, duration_s, 20_000, pid)
            results[shape] = (opened, closed)
        report(results, duration_s)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per phase")
    parser.add_argument("--shape", action="append", choices=list(SHAPES),
                        help="only this request shape (repeatable)")
    args = parser.parse_args()
    main(args.duration, args.shape)
    sys.exit(0)

"""REST service latency under load: `ksweep serve` on a store of 1,000 sweeps and 10,000 trials.

A SQLite store in a temporary folder is seeded through SQLAlchemy (not HTTP) with 1,000 sweeps
spread over three owners and the states succeeded, cancelled, failed and queued (no running
ones: the supervisor would restart their absent drivers), 10 trial rows each with every
metric of ``sweeps.spec.METRIC_NAMES``, and a ``build_report`` report on every succeeded or
failed sweep. The stored spec is the quickstart spec with five alphas (10 trials), canonicalised
as the API stores it. A real ``python -m ksweep.cli serve`` of this checkout then runs on that
store with its queue paused (``KSWEEP_MAX_CONCURRENT_SWEEPS=0``: submissions stay queued,
nothing trains).

The load generator (asyncio, one keep-alive connection per client, 127.0.0.1 only) measures
each request's latency client-side, one endpoint at a time: ``GET /sweeps/{id}`` (random seeded
ids), ``GET /sweeps`` (default limit 50) and ``POST /sweeps`` (the quickstart spec; one in four
with a fresh Idempotency-Key). Each endpoint runs with 32 concurrent clients, then with one
client (the latency without queueing). Every phase is bounded in requests and in time. Printed
too: the CPU time per request of the server and of the load generator, and the throughput;
32 closed-loop clients wait, on average, 32 / throughput (Little's law).

Goal (32 clients): p99 <= 50 ms for the reads, <= 200 ms for a submission. On a small machine
the load generator shares the CPUs with the server; by default it is a minimal HTTP/1.1 client
that costs ~0.1 ms of CPU per request, where httpx costs as much as the server (``--client
httpx`` to see that).

``python -m benchmarks.bench_service [--client raw|httpx] [--profile DIR]``: with ``--profile``,
py-spy records the server (GIL-holding samples) during each 32-client phase into DIR as
speedscope JSON; profiling slows the server, so a profiled run's figures are not the benchmark's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks._service_store import (
    N_SWEEPS,
    QUICKSTART,
    ROOT,
    SEED,
    TOKENS,
    TRIALS_PER_SWEEP,
    seed_store,
)
from sweeps.spec import load_sweep_spec
from tests.support.serve_process import ServeProcess

CLIENTS = 32
PER_CLIENT = 25          # requests per client and endpoint with 32 clients (800 in all)
SINGLE_REQUESTS = 150    # requests of the one-client phase
PHASE_LIMIT_S = 15.0     # no phase runs longer than this, whatever the counts
WARMUP_PER_CLIENT = 2    # requests per client and endpoint before anything is measured
REQUEST_TIMEOUT_S = 60.0
GOALS_S = {"GET /sweeps/{id}": 0.050, "GET /sweeps": 0.050, "POST /sweeps": 0.200}


# ---- the server -------------------------------------------------------------------------------


def make_server(folder: Path) -> ServeProcess:
    """``python -m ksweep.cli serve`` on the seeded store, queue paused."""
    env = {
        **os.environ,
        "KSWEEP_HOST": "127.0.0.1",
        "KSWEEP_SWEEP_ROOT": str(folder),
        "KSWEEP_API_TOKENS": ",".join(f"{o}:{t}" for o, t in TOKENS.items()),
        "KSWEEP_MAX_CONCURRENT_SWEEPS": "0",
        "KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER": "1000000",
        "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlflow.db",
        "RAY_ADDRESS": "",
        "PYTHONUNBUFFERED": "1",
        # This checkout's service, whatever the environment's editable install points at.
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
    }
    return ServeProcess(env, folder / "serve.log", cwd=folder)


# ---- the load -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    method: str
    path: str  # under /api/v1
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""


class RawConnection:
    """One keep-alive HTTP/1.1 connection, just enough of a client for this load.

    httpx costs about as much CPU per request as the service itself does for a small read, and
    on a small machine the load generator shares the CPUs with the server: this client keeps
    the generator's share small, so the figures are the service's (``--client httpx`` to compare).
    """

    def __init__(self, host: str, port: int, prefix: str) -> None:
        self.host, self.port, self.prefix = host, port, prefix
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, request: Request) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        lines = [f"{request.method} {self.prefix}{request.path} HTTP/1.1",
                 f"Host: {self.host}:{self.port}", *(f"{k}: {v}" for k, v in request.headers)]
        if request.body or request.method == "POST":
            lines += ["Content-Type: application/json", f"Content-Length: {len(request.body)}"]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + request.body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, close = 0, False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                raise RuntimeError("chunked responses are not expected from this service")
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        await self.reader.readexactly(length)
        if close:
            await self.close()
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


class HttpxConnection:
    """A client of a shared ``httpx.AsyncClient`` (its pool holds one connection per client)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def send(self, request: Request) -> int:
        headers = dict(request.headers)
        if request.body:
            headers["Content-Type"] = "application/json"
        response = await self.client.request(request.method, request.path, headers=headers,
                                             content=request.body or None)
        return response.status_code

    async def close(self) -> None:
        pass


Connection = RawConnection | HttpxConnection
MakeRequest = Callable[[int, int], Request]  # (client, n-th request of that client) -> request


@dataclass
class Phase:
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[int, int] = field(default_factory=dict)
    wall_s: float = 0.0
    server_cpu_s: float = math.nan  # CPU seconds the server process used during the phase
    client_cpu_s: float = math.nan  # and the load generator (this process)
    cut_short: bool = False

    def per_request_ms(self, seconds: float) -> float:
        return seconds / len(self.latencies_s) * 1e3 if self.latencies_s else math.nan

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        if not ordered:
            return math.nan
        return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]


def endpoints(sweep_ids: list[str], body: dict[str, Any]) -> dict[str, tuple[MakeRequest, set[int]]]:
    """Each endpoint's requests, and the statuses that count as success."""
    rng = random.Random(SEED)
    picks = [rng.choice(sweep_ids) for _ in range(50_000)]
    owners = list(TOKENS)
    run = uuid.uuid4().hex[:8]
    payload = json.dumps(body).encode()

    def get_one(client: int, n: int) -> Request:
        return Request("GET", f"/sweeps/{picks[(client * 997 + n) % len(picks)]}")

    def get_list(client: int, n: int) -> Request:
        return Request("GET", "/sweeps")

    def submit(client: int, n: int) -> Request:
        owner = owners[(client + n) % len(owners)]
        headers = [("Authorization", f"Bearer {TOKENS[owner]}")]
        if n % 4 == 3:
            headers.append(("Idempotency-Key", f"bench-{run}-{client}-{n}"))
        return Request("POST", "/sweeps", tuple(headers), payload)

    return {"GET /sweeps/{id}": (get_one, {200}), "GET /sweeps": (get_list, {200}),
            "POST /sweeps": (submit, {201})}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads and its child
    processes (uvicorn workers, should it run some); NaN once it is gone."""
    try:
        process = psutil.Process(pid)
        total = sum(process.cpu_times()[:2])
        children = process.children(recursive=True)
    except psutil.NoSuchProcess:
        return math.nan
    for child in children:
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:  # ended between the listing and the read
            continue
    return total


async def run_phase(connections: list[Connection], make: MakeRequest, ok: set[int],
                    per_client: int, limit_s: float, offset: int = 0,
                    server_pid: int | None = None) -> Phase:
    """Each connection is one client sending ``per_client`` requests back to back."""
    phase = Phase()
    server_cpu = process_cpu_s(server_pid) if server_pid else math.nan
    client_cpu = time.process_time()
    started = time.perf_counter()
    deadline = started + limit_s

    async def client(index: int, connection: Connection) -> None:
        for n in range(offset, offset + per_client):
            if time.perf_counter() > deadline:
                phase.cut_short = True
                return
            request = make(index, n)
            begin = time.perf_counter()
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                status = await connection.send(request)
            elapsed = time.perf_counter() - begin
            if status in ok:
                phase.latencies_s.append(elapsed)
            else:
                phase.errors[status] = phase.errors.get(status, 0) + 1

    await asyncio.gather(*(client(i, c) for i, c in enumerate(connections)))
    phase.wall_s = time.perf_counter() - started
    phase.client_cpu_s = time.process_time() - client_cpu
    if server_pid:
        phase.server_cpu_s = process_cpu_s(server_pid) - server_cpu
    return phase


def _start_profile(pid: int, folder: Path, name: str) -> subprocess.Popen | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("  (py-spy not found: no profile)")
        return None
    stem = folder / name.replace(" ", "_").replace("/", "_").replace("{", "").replace("}", "")
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--rate", "100", "--gil", "--nonblocking",
         "--format", "speedscope", "--output", f"{stem}.speedscope.json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_profile(spy: subprocess.Popen | None) -> None:
    if spy is None:
        return
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()


async def measure(server: ServeProcess, sweep_ids: list[str], body: dict[str, Any], client_kind: str,
                  profile: Path | None) -> dict[str, dict[int, Phase]]:
    assert server.process is not None
    pid = server.process.pid
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    results: dict[str, dict[int, Phase]] = {}
    async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60) as shared:
        connections: list[Connection] = [
            RawConnection("127.0.0.1", server.port, "/api/v1") if client_kind == "raw"
            else HttpxConnection(shared) for _ in range(CLIENTS)]
        try:
            calls = endpoints(sweep_ids, body)
            for make, ok in calls.values():  # warm-up: connections, caches, code paths
                await run_phase(connections, make, ok, WARMUP_PER_CLIENT, 30.0, offset=10_000)
            for name, (make, ok) in calls.items():
                spy = _start_profile(pid, profile, name) if profile else None
                loaded = await run_phase(connections, make, ok, PER_CLIENT, PHASE_LIMIT_S,
                                         server_pid=pid)
                _stop_profile(spy)
                single = await run_phase(connections[:1], make, ok, SINGLE_REQUESTS,
                                         PHASE_LIMIT_S, offset=1_000, server_pid=pid)
                results[name] = {CLIENTS: loaded, 1: single}
        finally:
            for connection in connections:
                await connection.close()
    return results


# ---- the report ---------------------------------------------------------------------------------


def print_results(results: dict[str, dict[int, Phase]], client: str) -> None:
    print(f"\n== REST service under load: {N_SWEEPS:,} sweeps, {N_SWEEPS * TRIALS_PER_SWEEP:,} "
          f"trials (SQLite), {os.cpu_count()} CPUs shared by server and load generator ({client} "
          "client)")
    print(f"  {'endpoint':<18s} {'clients':>7s} {'requests':>8s} {'p50 ms':>8s} {'p95 ms':>8s} "
          f"{'p99 ms':>8s} {'max ms':>8s} {'req/s':>8s}  goal (p99, 32 clients)")
    for name, phases in results.items():
        goal = GOALS_S[name]
        for clients, phase in sorted(phases.items(), reverse=True):
            p99 = phase.percentile(99)
            verdict = ""
            if clients == CLIENTS:
                verdict = f"<= {goal * 1e3:.0f} ms: {'PASS' if p99 <= goal else 'over goal'}"
            if phase.errors:
                verdict += f"  errors {phase.errors}"
            if phase.cut_short:
                verdict += f"  (stopped at {PHASE_LIMIT_S:.0f} s)"
            top = max(phase.latencies_s, default=math.nan)
            rate = len(phase.latencies_s) / phase.wall_s if phase.wall_s else math.nan
            print(f"  {name:<18s} {clients:>7d} {len(phase.latencies_s):>8d} "
                  f"{phase.percentile(50) * 1e3:8.1f} {phase.percentile(95) * 1e3:8.1f} "
                  f"{p99 * 1e3:8.1f} {top * 1e3:8.1f} {rate:8.1f}  {verdict}")
    print("  (one client: the latency without queueing; 32 clients: the goal figures, queueing "
          "included)")
    print("  CPU per request (server, load generator) and what 32 closed-loop clients imply "
          "(Little's law: mean latency ~ 32 / throughput):")
    for name, phases in results.items():
        for clients, phase in sorted(phases.items(), reverse=True):
            server = phase.per_request_ms(phase.server_cpu_s)
            generator = phase.per_request_ms(phase.client_cpu_s)
            line = (f"  {name:<18s} {clients:>2d} client{'s' if clients > 1 else ' '}: server "
                    f"{server:5.2f} ms CPU, load generator {generator:5.2f} ms CPU")
            if clients == CLIENTS and phase.latencies_s:
                mean = statistics.fmean(phase.latencies_s)
                line += (f"; mean latency {mean * 1e3:6.1f} ms ~ {CLIENTS} / "
                         f"{len(phase.latencies_s) / phase.wall_s:.0f} req/s")
            print(line)


def main(client: str = "raw", profile: Path | None = None) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ksweep-bench-service-"))
    server: ServeProcess | None = None
    try:
        started = time.perf_counter()
        sweep_ids = seed_store(f"sqlite:///{folder / 'service.db'}", random.Random(SEED))
        seeded_s = time.perf_counter() - started
        server = make_server(folder)
        server.start()
        body = load_sweep_spec(QUICKSTART).model_dump(mode="json")
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
        results = asyncio.run(measure(server, sweep_ids, body, client, profile))
        print_results(results, client)
        print(f"  (store seeded in {seeded_s:.1f} s; the server as `ksweep serve` runs it)")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="load generator: a minimal HTTP/1.1 client (default) or httpx")
    parser.add_argument("--profile", type=Path, default=None,
                        help="record the server with py-spy during each 32-client phase into DIR")
    args = parser.parse_args()
    main(args.client, args.profile)

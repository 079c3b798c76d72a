"""What ``ksweep extend`` saves: quickstart + 2 seeds, extended against a fresh sweep of the union.

A real ``python -m ksweep.cli serve`` of this checkout runs on a temporary root (its own store,
sweep root and sqlite MLflow store; one sweep at a time). The quickstart spec (15 trials) runs
first, untimed. Then, each timed from its request until the sweep reads ``succeeded``:

- **extend**: ``POST /sweeps/{id}/extend`` with seeds 3 and 4 on that sweep: its 10 new trials
  train, its 15 trials are its own (not run again);
- **fresh union**: quickstart with seeds 0-4 submitted as a new sweep: 25 trials;
- **fresh union, reuse: own** (``--reuse``): the same, asking to reuse: the 15 trials of the
  first sweep are taken by content hash, 10 train. It runs before the extension (after it, the
  first sweep holds all 25 and nothing would train).

Every phase runs in the same service under the same ``nice`` as the caller (run the script
under ``nice -n 5``: the phases are niced equally); the 1-minute load average is printed beside
each. ``python -m benchmarks.bench_extend [--reuse] [--epochs N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from ksweep import Client

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
TOKEN = "bench-token"


def _service(workdir: Path):
    from tests.support.serve_process import ServeProcess

    env = {**os.environ, "KSWEEP_HOST": "127.0.0.1", "KSWEEP_SWEEP_ROOT": str(workdir / "root"),
           "KSWEEP_API_TOKENS": f"bench:{TOKEN}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}",
           "KSWEEP_MAX_CONCURRENT_SWEEPS": "1", "KSWEEP_POLL_INTERVAL_S": "0.5",
           "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return ServeProcess(env, workdir / "serve.log", cwd=workdir)


def _wait(client: Client, sweep_id: str, started: float) -> float:
    while True:
        sweep = client.get(sweep_id)
        if sweep.state == "succeeded":
            return time.perf_counter() - started
        if sweep.state in ("failed", "cancelled"):
            raise RuntimeError(f"sweep {sweep_id} {sweep.state}: {sweep.error}")
        time.sleep(0.5)


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def run(reuse: bool, epochs: int | None) -> list[dict[str, Any]]:
    spec = yaml.safe_load(QUICKSTART.read_text())
    if epochs is not None:
        spec["template"]["training"]["epochs"] = epochs
    union = copy.deepcopy(spec) | {"name": "quickstart-union", "seeds": 5}
    rows = []
    with tempfile.TemporaryDirectory(prefix="ksweep-bench-extend-") as tmp:
        service = _service(Path(tmp))
        service.start(timeout_s=300)
        try:
            with Client(service.url.removesuffix("/api/v1"), TOKEN, timeout=120) as client:
                started = time.perf_counter()
                base = client.submit(spec).id
                rows.append({"phase": "quickstart (untimed base)", "trials trained": 15,
                             "reused": 0, "seconds": _wait(client, base, started),
                             "load": _load()})
                if reuse:
                    load, started = _load(), time.perf_counter()
                    again = client.submit(union | {"name": "quickstart-reuse", "reuse": "own"}).id
                    seconds = _wait(client, again, started)
                    reused = client.report_json(again)["dedup"]["trials_reused"]
                    rows.append({"phase": "fresh union, reuse: own", "trials trained": 25 - reused,
                                 "reused": reused, "seconds": seconds, "load": f"{load}-{_load()}"})
                load, started = _load(), time.perf_counter()
                client.extend(base, seeds=[3, 4])
                seconds = _wait(client, base, started)
                report = client.report_json(base)
                rows.append({"phase": "extend +2 seeds", "trials trained": 10,
                             "reused": report["dedup"]["trials_run"] - 10, "seconds": seconds,
                             "load": f"{load}-{_load()}"})
                load, started = _load(), time.perf_counter()
                fresh = client.submit(union).id
                rows.append({"phase": "fresh union", "trials trained": 25, "reused": 0,
                             "seconds": _wait(client, fresh, started),
                             "load": f"{load}-{_load()}"})
        finally:
            service.stop()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse", action="store_true", help="Also time a fresh union with reuse: own.")
    parser.add_argument("--epochs", type=int, default=None, help="Epochs per trial (quickstart: 8).")
    parser.add_argument("--out", type=Path, default=None, help="Also write the table here.")
    args = parser.parse_args(argv)
    rows = run(args.reuse, args.epochs)
    fresh = next(r["seconds"] for r in rows if r["phase"] == "fresh union")
    extend = next(r["seconds"] for r in rows if r["phase"] == "extend +2 seeds")
    lines = [f"bench_extend: quickstart + 2 seeds, nice {os.nice(0)}, {os.cpu_count()} CPUs",
             f"{'phase':<28} {'trained':>8} {'not rerun':>10} {'seconds':>8}  load (1-min)"]
    lines += [f"{r['phase']:<28} {r['trials trained']:>8} {r['reused']:>10} {r['seconds']:>8.1f}  "
              f"{r['load']}" for r in rows]
    lines.append(f"extend saved {fresh - extend:.1f} s against the fresh union "
                 f"({extend / fresh:.2f} of its time)")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

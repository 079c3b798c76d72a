"""A sweep on its own local Ray or on one Ray it connects to: what sharing a Ray saves.

The same small cohort sweep (the quickstart task, as :mod:`benchmarks.bench_member_overhead`
cuts it) runs by ``ksweep sweep run``, whole processes alternating A B B A: ``own`` starts and
stops its local Ray (the lean one, as every sweep without ``RAY_ADDRESS``); ``shared`` connects
to a ``ray start --head`` (no dashboard) started for the two B runs, as drivers on a Ray
cluster do (a running head would take the A runs too: ``ray.init`` joins a local one). A first
sweep, not counted, warms the caches. Wall: launch to exit. CPU: the whole machine's (``/proc/stat``), so run it on an
idle machine. Then the idle head's CPU per second over ``--idle-s``: a Ray kept up between
sweeps costs that all the time. Printed: each variant's median wall and CPU, their difference,
and how many sweeps an hour a kept Ray needs before it saves CPU.

    python -m benchmarks.bench_shared_ray [--members N] [--epochs E] [--rounds R] [--idle-s S]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.bench_member_overhead import ROOT, print_medians, sweep_env, write_spec
from benchmarks.machine_cpu import machine_cpu_seconds, run_measured


@contextlib.contextmanager
def _head(ray: Path, env: dict[str, str]) -> Iterator[None]:
    """One ``ray start --head --block`` (two CPUs, no dashboard) for the block, settled before
    use, then stopped by its own process (``ray stop`` would stop every Ray on the machine)."""
    head = subprocess.Popen([str(ray), "start", "--head", "--block", "--num-cpus", "2",
                             "--include-dashboard=false", "--disable-usage-stats"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(8.0)  # the head's start-up settles before its idle cost is read
        if head.poll() is not None:
            raise RuntimeError(f"ray start --head exited {head.returncode}")
        yield
    finally:
        head.send_signal(signal.SIGTERM)  # --block stops the head's processes on SIGTERM
        head.wait(timeout=60)
        time.sleep(1.0)


def _idle_cpu_per_s(seconds: float) -> float:
    cpu = machine_cpu_seconds()
    time.sleep(seconds)
    return (machine_cpu_seconds() - cpu) / seconds


def main(members: int = 3, epochs: int = 4, rounds: int = 3, idle_s: float = 30.0,
         train_size: int = 256) -> dict[str, float]:
    ray = Path(sys.executable).with_name("ray")
    ksweep = Path(sys.executable).with_name("ksweep")
    samples: dict[str, list[tuple[float, float]]] = {"own": [], "shared": []}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-shared-ray-") as tmp:
        root = Path(tmp)
        spec = write_spec(root / "spec.yaml", members, epochs, train_size)
        sweep = [str(ksweep), "sweep", "run", str(spec), "--num-cpus", "2"]
        base = sweep_env(root)
        base.pop("RAY_ADDRESS", None)
        run_measured(sweep, base | {"KSWEEP_SWEEP_ROOT": str(root / "warm-up")}, ROOT)  # cold caches: not counted
        idle_machine = _idle_cpu_per_s(idle_s)
        idle_heads = []
        for index in range(rounds):
            samples["own"].append(run_measured(sweep, base | {"KSWEEP_SWEEP_ROOT": str(root / f"own-{index}-a")}, ROOT))
            with _head(ray, base):  # ray.init without an address would join it: own runs without it
                idle_heads.append(_idle_cpu_per_s(idle_s))
                for turn in ("a", "b"):
                    env = base | {"KSWEEP_SWEEP_ROOT": str(root / f"shared-{index}-{turn}"), "RAY_ADDRESS": "auto"}
                    samples["shared"].append(run_measured(sweep, env, ROOT))
            samples["own"].append(run_measured(sweep, base | {"KSWEEP_SWEEP_ROOT": str(root / f"own-{index}-b")}, ROOT))
            loads.append(os.getloadavg()[0])
        idle_head = statistics.median(idle_heads)
    print(f"\n== a cohort of {members}, {epochs} epochs, {train_size} train examples on its own local Ray "
          f"or on one shared head; A B B A x {rounds}; 1-min load {', '.join(f'{x:.1f}' for x in loads)}")
    medians = print_medians(samples)
    saved_wall = medians["own"][0] - medians["shared"][0]
    saved_cpu = medians["own"][1] - medians["shared"][1]
    head_cost = max(idle_head - idle_machine, 0.0)
    print(f"  shared saves per sweep: {saved_wall:+.2f} s wall, {saved_cpu:+.2f} CPU-s")
    print(f"  the idle head: {head_cost:.4f} CPU-s per second over the machine's idle "
          f"{idle_machine:.4f} ({idle_s:.0f} s each)")
    if saved_cpu > 0:
        print(f"  a kept head pays off above {head_cost * 3600 / saved_cpu:.0f} sweeps an hour "
              f"(one every {saved_cpu / head_cost:.0f} s)" if head_cost > 0 else "  a kept head costs nothing idle")
    else:
        print("  a shared head saves no CPU per sweep here")
    return {"saved_wall_s": saved_wall, "saved_cpu_s": saved_cpu, "head_cpu_per_s": head_cost}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--train-size", type=int, default=256)
    args = parser.parse_args()
    main(args.members, args.epochs, args.rounds, args.idle_s, args.train_size)

"""A cohort's metric writes in a writer process or in its own process: where the child pays off.

One cohort of N members (the quickstart task, as :mod:`benchmarks.bench_member_overhead` cuts
it) runs by ``ksweep sweep run`` twice over, whole processes alternating A B B A: ``child``
with ``KSWEEP_WRITER_PROCESS_MIN_RUNS=1`` (every cohort writes through a writer process) and
``in-process`` with it above N (the trial process's writer thread writes). Wall: launch to exit.
CPU: the whole machine's (``/proc/stat``: Ray's processes outlive the driver, so a reaped tree
undercounts), so run it on an idle machine. Printed per N: each variant's median wall and CPU,
and child minus in-process; the default threshold
(:data:`workers.tracking.writer_process.DEFAULT_MIN_RUNS`) sits where the child stops costing more.

    python -m benchmarks.bench_writer_process [--members N [N ...]] [--epochs E] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.bench_member_overhead import ROOT, print_medians, sweep_env, write_spec
from benchmarks.machine_cpu import run_measured
from workers.settings import DEFAULT_MIN_RUNS, MIN_RUNS_ENV


def measure(members: int, epochs: int, rounds: int, train_size: int) -> dict[str, tuple[float, float]]:
    """One cohort size: (median wall, median CPU) of ``child`` and ``in-process``."""
    ksweep = Path(sys.executable).with_name("ksweep")
    samples: dict[str, list[tuple[float, float]]] = {"child": [], "in-process": []}
    threshold = {"child": "1", "in-process": str(members + 1)}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-writer-") as tmp:
        root = Path(tmp)
        spec = write_spec(root / "spec.yaml", members, epochs, train_size)
        base = sweep_env(root)
        for index in range(rounds):
            for name in ("child", "in-process", "in-process", "child"):
                run_root = root / f"sweeps-{index}-{name}-{len(samples[name])}"
                env = base | {MIN_RUNS_ENV: threshold[name], "KSWEEP_SWEEP_ROOT": str(run_root)}
                samples[name].append(run_measured([str(ksweep), "sweep", "run", str(spec), "--num-cpus", "2"], env, ROOT))
                loads.append(os.getloadavg()[0])
    print(f"\n== a cohort of {members}, {epochs} epochs, {train_size} train examples; whole "
          f"processes, A B B A x {rounds}; 1-min load {', '.join(f'{x:.1f}' for x in loads)}")
    medians = print_medians(samples)
    wall = medians["child"][0] - medians["in-process"][0]
    cpu = medians["child"][1] - medians["in-process"][1]
    print(f"  child - in-process: {wall:+.2f} s wall, {cpu:+.2f} CPU-s")
    return medians


def main(members: Sequence[int] = (2, 4, 8, 16), epochs: int = 4, rounds: int = 1,
         train_size: int = 256) -> None:
    print(f"writer process from {DEFAULT_MIN_RUNS} members on by default ({MIN_RUNS_ENV})")
    for size in members:
        measure(size, epochs, rounds, train_size)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--train-size", type=int, default=256)
    args = parser.parse_args()
    main(args.members, args.epochs, args.rounds, args.train_size)

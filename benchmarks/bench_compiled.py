"""The compiled cohort step against the eager one on the CPU, side by side in one process.

For each K: two cohorts of the same K sweep trials (``bench_cohort.sweep_configs``: the
quickstart task, torch on one thread), one eager (``training.compile: off``), one compiled
(``on``; workers/cohort/compiled.py, backend inductor unless ``--backend``). Their training
passes alternate (eager, compiled, eager, ...), so drift on a shared machine hits both
alike. The compiled cohort's first pass holds the compile: it is printed apart as
``warm-up s`` (the step's own count: the first step of each length bucket) and left out of
the steady per-step figures, which are medians over the later passes (wall and process CPU
milliseconds per optimisation step); ``end to end`` is every pass's wall, the compile
included, compiled over eager. ``training.compile: auto`` compiles only on device
types where this measured faster (``workers.cohort.compiled.MEASURED_FASTER``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from benchmarks.bench_cohort import sweep_configs
from workers.cohort.compiled import CompiledStep, use_inductor_cache
from workers.cohort.trainer import Cohort


def _pass(cohort: Cohort) -> tuple[float, float]:
    """One training pass (no epoch end): wall and CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    cohort._train_pass(cohort.active)
    return time.perf_counter() - wall, time.process_time() - cpu


def main(sizes: tuple[int, ...] = (8, 32), passes: int = 4, train_size: int = 256,
         backend: str = "inductor") -> None:
    torch.set_num_threads(1)
    CompiledStep.backend = backend
    print(f"\n== compiled vs eager cohort step on the CPU (1 torch thread, backend {backend}): quickstart "
          f"task, {train_size} train examples per pass, {passes} passes each, alternating; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  {'K':>4} {'steps':>5} {'eager ms/step':>14} {'compiled ms/step':>17} {'compiled/eager':>15} "
          f"{'eager CPU ms':>13} {'compiled CPU ms':>16} {'warm-up s':>10} {'end to end':>11}")
    with tempfile.TemporaryDirectory() as cache:
        use_inductor_cache(cache)
        for size in sizes:
            cohorts = {mode: Cohort.create(sweep_configs(size, passes, train_size, device="cpu", compile=mode), cache)
                       for mode in ("off", "on")}
            step = cohorts["on"]._compiled
            times: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
            for _ in range(passes):
                for mode, cohort in cohorts.items():
                    times[mode].append(_pass(cohort))
            steps = cohorts["off"].step // passes
            eager = [statistics.median(t[i] for t in times["off"][1:]) * 1e3 / steps for i in (0, 1)]
            compiled = [statistics.median(t[i] for t in times["on"][1:]) * 1e3 / steps for i in (0, 1)]
            note = f"  fell back: {cohorts['on'].compile_fallback}" if step is None or step.fallback else ""
            warm_up = step.compile_seconds if step is not None else 0.0
            end_to_end = sum(w for w, _ in times["on"]) / sum(w for w, _ in times["off"])
            print(f"  {size:>4} {steps:>5} {eager[0]:>14.1f} {compiled[0]:>17.1f} {compiled[0] / eager[0]:>14.2f}x "
                  f"{eager[1]:>13.1f} {compiled[1]:>16.1f} {warm_up:>10.1f} {end_to_end:>10.1f}x{note}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--passes", type=int, default=4, help="training passes per mode (the first is warm-up)")
    parser.add_argument("--train-size", type=int, default=256)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: no C++ build)")
    args = parser.parse_args()
    main(tuple(args.sizes), args.passes, args.train_size, args.backend)

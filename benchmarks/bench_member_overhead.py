"""What a cohort member costs on top of its compute: ``ksweep sweep run`` vs the bare cohort loop.

The same N trials (the quickstart task, alpha 1, ``raw_plus_ncc``, seeds 0..N-1: N rows that no
deduplication merges) run as one cohort two ways, each a whole fresh process:

- ``ksweep``: ``ksweep sweep run`` on a spec with ``resources.cohort_size: N`` (local Ray on 2
  CPUs, the MLflow sqlite store, one run per member, per-epoch checkpoints, PNGs, the report);
- ``bare``: this module with ``--bare``: the plan's trial configs (``SweepSpec.trial_config_for``
  of ``build_plan(spec).trials``) trained by ``Cohort.create(configs).run()``: no Tune, no MLflow,
  no plots, no checkpoints.

The two alternate A B B A (``--rounds`` times), so drift on a shared machine hits both alike.
Wall: launch to exit. CPU: the reaped process tree's user + system seconds
(``getrusage(RUSAGE_CHILDREN)``; Ray processes that outlive their parent are not counted, so
ksweep's CPU is a lower bound). Printed: each variant's median wall and CPU, the ratio ksweep
/ bare, and the per-member overhead (ksweep - bare) / N, wall and CPU, with the load average.
The issue's goal: ratio <= 1.10x and <= 0.1 s of wall per member.

With several sizes (``--members 16 64``, what ``make bench`` runs), the extra wall
(ksweep - bare) is fitted against N: the slope is what one more member costs beyond its
compute, the intercept the sweep's fixed cost (imports, the local Ray, the MLflow store, the
report), which no member count changes.

    python -m benchmarks.bench_member_overhead [--members N [N ...]] [--epochs E] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
GOAL_RATIO, GOAL_WALL_S = 1.10, 0.1


def write_spec(path: Path, members: int, epochs: int, train_size: int) -> Path:
    """The quickstart spec cut to ``members`` seeds of one objective, trained as one cohort."""
    spec = yaml.safe_load(QUICKSTART.read_text())
    spec.update(name="bench-member-overhead", alpha=[1.0], loss_stacks=["raw_plus_ncc"],
                models=["discrete"], seeds=members)
    spec["template"]["data"].update(train_size=train_size, val_size=128, test_size=128)
    spec["template"]["training"].update(epochs=epochs, device="cpu")
    spec.setdefault("budget", {})["max_concurrent_trials"] = 1
    spec["resources"] = {"cpu": 1.0, "gpu": 0.0, "cohort_size": members}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def bare(spec_path: Path, cache: Path, cohort: int | None = None) -> None:
    """The bare cohort loop of the spec's trials (of its plan's cohort ``cohort`` when given: what
    ``bench_headline --floor`` runs); prints ``{"members", "loop_wall", "loop_cpu"}``."""
    import torch

    from sweeps.plan.build import build_plan
    from sweeps.spec import load_sweep_spec
    from workers.cohort.trainer import Cohort

    torch.set_num_threads(1)
    spec = load_sweep_spec(spec_path)
    plan = build_plan(spec)
    trials = plan.trials if cohort is None else [plan.trials[i] for i in plan.cohorts[cohort]]
    configs = [spec.trial_config_for(trial) for trial in trials]
    wall, cpu = time.perf_counter(), time.process_time()
    members = Cohort.create(configs, cache).run()
    if any(m.status != "finished" for m in members):
        raise SystemExit(f"bare cohort {'' if cohort is None else cohort}: "
                         f"{[m.error for m in members if m.error]}")
    print(json.dumps({"members": len(members), "loop_wall": time.perf_counter() - wall,
                      "loop_cpu": time.process_time() - cpu}))


def sweep_env(root: Path) -> dict[str, str]:
    """The environment of a benchmark's ``ksweep sweep run``: this checkout's code, an MLflow
    store and a sweep root under ``root``, torch on one thread (as Ray gives each trial)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "KSWEEP_SWEEP_ROOT": str(root / "sweeps"),
            "OMP_NUM_THREADS": "1"}


def print_medians(samples: dict[str, list[tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """Each variant's median wall and CPU, printed with its runs (wall/CPU); returned by name."""
    medians = {name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
               for name, values in samples.items()}
    width = max(map(len, samples))
    for name, values in samples.items():
        runs = ", ".join(f"{w:.1f}/{c:.1f}" for w, c in values)
        print(f"  {name:<{width}s} wall {medians[name][0]:6.2f} s  CPU {medians[name][1]:6.2f} s  "
              f"(runs wall/CPU: {runs})")
    return medians


def timed_process(command: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, float, str]:
    """Run a whole process; (wall s, CPU s of the reaped tree, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def main(members: Sequence[int] = (16, 64), epochs: int = 2, rounds: int = 1,
         train_size: int = 256) -> dict[int, dict[str, float]]:
    """Each size in turn; with two or more, the per-member slope and the fixed cost."""
    results = {size: measure(size, epochs, rounds, train_size) for size in members}
    if len(results) >= 2:
        per_member, fixed = member_and_fixed_cost(results)
        print(f"\n== fitted over N = {', '.join(map(str, sorted(results)))}: "
              "ksweep - bare = fixed + N x per member")
        print(f"  per extra member beyond its compute: {per_member:+.3f} s of wall "
              f"(goal <= {GOAL_WALL_S} s: {'met' if per_member <= GOAL_WALL_S else 'NOT met'})")
        print(f"  the sweep's fixed cost: {fixed:.2f} s of wall")
    return results


def member_and_fixed_cost(results: dict[int, dict[str, float]]) -> tuple[float, float]:
    """(s per member, fixed s): the least-squares line of ksweep - bare wall against N."""
    sizes = sorted(results)
    extra = [results[size]["ksweep_wall"] - results[size]["bare_wall"] for size in sizes]
    fit = statistics.linear_regression(sizes, extra)
    return fit.slope, fit.intercept


def measure(members: int, epochs: int, rounds: int, train_size: int) -> dict[str, float]:
    """One size: ``ksweep sweep run`` against the bare cohort loop, whole processes, A B B A."""
    ksweep = Path(sys.executable).with_name("ksweep")
    samples: dict[str, list[tuple[float, float]]] = {"bare": [], "ksweep": []}
    loads = [os.getloadavg()[0]]
    loop: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-member-") as tmp:
        root = Path(tmp)
        spec = write_spec(root / "spec.yaml", members, epochs, train_size)
        env = sweep_env(root)
        commands = {
            "bare": [sys.executable, "-m", "benchmarks.bench_member_overhead", "--bare", str(spec),
                     "--cache", str(root / "cache")],
            "ksweep": [str(ksweep), "sweep", "run", str(spec), "--num-cpus", "2"],
        }
        timed_process(commands["bare"], env)  # warm-up: the oracle cache, the page cache
        for _ in range(rounds):
            for name in ("bare", "ksweep", "ksweep", "bare"):
                wall, cpu, out = timed_process(commands[name], env)
                samples[name].append((wall, cpu))
                loads.append(os.getloadavg()[0])
                if name == "bare":
                    loop.append(json.loads(out.strip().splitlines()[-1])["loop_wall"])
    wall = {name: statistics.median(w for w, _ in values) for name, values in samples.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in samples.items()}
    result = {"ksweep_wall": wall["ksweep"], "bare_wall": wall["bare"],
              "ratio_wall": wall["ksweep"] / wall["bare"], "ratio_cpu": cpu["ksweep"] / cpu["bare"],
              "member_wall_s": (wall["ksweep"] - wall["bare"]) / members,
              "member_cpu_s": (cpu["ksweep"] - cpu["bare"]) / members}
    print(f"\n== per-member overhead: {members} trials as one cohort, {epochs} epochs, {train_size} train "
          f"examples; whole processes, A B B A x {rounds}")
    print(f"  1-min load average before and after each run: {', '.join(f'{x:.1f}' for x in loads)} on "
          f"{os.cpu_count()} CPUs (measured under load when above the CPU count)")
    for name in samples:
        runs = ", ".join(f"{w:.1f}/{c:.1f}" for w, c in samples[name])
        print(f"  {name:<7s} wall {wall[name]:7.2f} s  CPU {cpu[name]:7.2f} s  (runs wall/CPU: {runs})")
    print(f"  bare cohort loop alone (inside its process, median): {statistics.median(loop):.2f} s wall")
    print(f"  ksweep / bare: {result['ratio_wall']:.2f}x wall, {result['ratio_cpu']:.2f}x CPU "
          f"(goal <= {GOAL_RATIO:.2f}x: {'met' if result['ratio_wall'] <= GOAL_RATIO else 'NOT met'})")
    print(f"  per member: {result['member_wall_s']:+.3f} s wall, {result['member_cpu_s']:+.3f} s CPU "
          f"(goal <= {GOAL_WALL_S} s wall: {'met' if result['member_wall_s'] <= GOAL_WALL_S else 'NOT met'})")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--train-size", type=int, default=256)
    parser.add_argument("--bare", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, default=Path(".ksweep"), help=argparse.SUPPRESS)
    parser.add_argument("--cohort", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare(args.bare, args.cache, args.cohort)
    else:
        main(args.members, args.epochs, args.rounds, args.train_size)

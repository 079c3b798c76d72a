"""Where a cohort sweep's fixed cost goes: one ``ksweep sweep run``, as a timeline.

``bench_member_overhead`` fits a sweep's fixed cost (the wall that no member count changes);
this shows it. One whole ``ksweep sweep run`` of N members as one cohort (the
``bench_member_overhead`` spec, a new sqlite store whose tables are made first, as a
researcher's later sweeps find theirs; ``--fresh-store`` leaves them to the sweep) is started, and its process tree is
sampled every 20 ms (psutil: each process's creation time and command line: Ray's GCS,
raylet, dashboard and agents, the trial worker, the cohort's metric writer). After it exits,
the MLflow store gives the parent run's start and end, the members' runs' starts and ends and
member 0's per-epoch metric timestamps. Every event is printed in seconds from the launch,
followed by the phases they bound:

- ``driver and Ray up``: launch to the trial worker's process (the driver's imports, Ray's
  start, the parent run, Tune's set-up);
- ``trial worker to its members' runs``: its imports, the MLflow store's set-up and the
  members' creation (a fresh cohort's runs are made by its metric writer process as the first
  epoch starts; a lone trial's by the worker, before it);
- ``training``: the first member run's start to the last member run's end;
- ``the end``: the last member run's end to the driver's exit (Tune's end, the report).

Then each process's CPU seconds (user + system, read at every sample), summed by process:
on a machine whose CPUs the sweep keeps busy, these are what a cut would save.

``--spec PATH`` times your own sweep instead (its trials' runs stand for the members; the
phases use the first trial worker). Its dataset and model stores are the default ones
(``KSWEEP_DATA_ROOT``, ``KSWEEP_MODEL_ROOT``), its MLflow store and sweep root fresh.

    python -m benchmarks.sweep_timeline [--members N] [--epochs E] [--train-size S] [--spec PATH]
                                        [--fresh-store]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.bench_member_overhead import ROOT, sweep_env, write_spec

# The program (a binary, or Python's script or module) -> the name a process gets in the
# timeline. Only the program is matched: the raylet's arguments name the worker script too.
_PROCESS_NAMES = (
    ("default_worker.py", "Ray worker (the trial actor)"),
    ("ray::", "Ray worker (the trial actor)"),  # a worker that has renamed itself
    ("workers.tracking.writer_process", "the cohort's metric writer"),
    ("dashboard/agent.py", "Ray dashboard agent"),
    ("runtime_env/agent", "Ray runtime-env agent"),
    ("dashboard/dashboard.py", "Ray API server (dashboard)"),
    ("log_monitor.py", "Ray log monitor"),
    ("monitor.py", "Ray autoscaler monitor"),
    ("gcs_server", "Ray GCS"),
    ("raylet", "Ray raylet"),
)


def _name(command: list[str]) -> str | None:
    program = command[0] if command and not command[0].endswith(("python", "python3")) else \
        " ".join(command[1:3])
    return next((name for fragment, name in _PROCESS_NAMES if fragment in program), None)


def _exec_name(process: psutil.Process) -> str | None:
    """:func:`_name` of a process, or None while it is a fork that has not yet exec'd its program:
    such a child still shows its parent's command line (a raylet's, for a worker it starts)."""
    command = process.cmdline()
    parent = process.parent()
    if parent is not None and parent.cmdline() == command:
        return None
    return _name(command)


DRIVER = "the driver (ksweep sweep run)"
OTHER = "other processes of the sweep"


def _sample(driver: subprocess.Popen, seen: dict[int, tuple[float, str]],
            cpu: dict[int, tuple[str, float]], busy: list[tuple[float, float]]) -> None:
    """Until the driver exits, record each new descendant of the driver with its creation time,
    every process's CPU seconds so far (user + system; ``cpu[pid] = (name, seconds)``) and the
    whole tree's CPU seconds so far at each sample (``busy``: (time, seconds)). A process's
    last 20 ms before it exits can be missed, so CPU figures are lower bounds."""
    root = psutil.Process(driver.pid)
    while driver.poll() is None:
        try:
            children = root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for process in [root, *children]:
            try:
                name = DRIVER if process.pid == driver.pid else seen.get(process.pid, (0.0, None))[1]
                if name is None:  # looked at again each time: a forked child execs a moment later
                    name = _exec_name(process)
                    if name is not None:
                        seen[process.pid] = (process.create_time(), name)
                times = process.cpu_times()
                cpu[process.pid] = (name or OTHER, times.user + times.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        busy.append((time.time(), sum(seconds for _, seconds in cpu.values())))
        time.sleep(0.02)


def _cpus_busy(busy: list[tuple[float, float]], start: float, end: float) -> float:
    """The tree's average CPUs busy between two times (the samples at or before each)."""
    def at(moment: float) -> float:
        return max((seconds for sampled, seconds in busy if sampled <= moment), default=0.0)
    return (at(end) - at(start)) / (end - start) if end > start else float("nan")


def cpu_by_name(cpu: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds summed by process name, largest first (several trial workers add up)."""
    totals: dict[str, float] = {}
    for name, seconds in cpu.values():
        totals[name] = totals.get(name, 0.0) + seconds
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def run_timeline(members: int, epochs: int, train_size: int, spec_path: Path | None = None,
                 fresh_store: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Run one sweep (the ``bench_member_overhead`` spec, or ``spec_path``) and print its
    timeline; returns the phases in seconds and the CPU seconds by process name.

    The MLflow store's tables are made before the launch, as a researcher's later sweeps find
    them; ``fresh_store`` leaves that to the sweep (a first sweep: MLflow's schema migrations
    run in the driver while Ray starts)."""
    from mlflow.tracking import MlflowClient

    from sweeps.plan.build import build_plan
    from sweeps.spec import load_sweep_spec
    from workers.contract import RUN_KIND_TAG, RUN_KIND_TRIAL

    ksweep = Path(sys.executable).with_name("ksweep")
    with tempfile.TemporaryDirectory(prefix="sweep-timeline-") as tmp:
        root = Path(tmp)
        spec = spec_path.resolve() if spec_path else write_spec(root / "spec.yaml", members, epochs, train_size)
        trials = build_plan(load_sweep_spec(spec)).trial_count
        uri = f"sqlite:///{root / 'mlflow.db'}"
        env = sweep_env(root)
        if not fresh_store:
            MlflowClient(uri).search_experiments()
        seen: dict[int, tuple[float, str]] = {}
        cpu: dict[int, tuple[str, float]] = {}
        busy: list[tuple[float, float]] = []
        load = os.getloadavg()[0]
        launched = time.time()
        driver = subprocess.Popen([str(ksweep), "sweep", "run", str(spec), "--num-cpus", "2"], cwd=ROOT,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _sample(driver, seen, cpu, busy)
        exited = time.time()
        output = driver.communicate()[0]
        if driver.returncode != 0:
            raise RuntimeError(f"ksweep sweep run exited {driver.returncode}:\n{output[-3000:]}")
        client = MlflowClient(uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(experiments, max_results=10_000)
        parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
        member_runs = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RUN_KIND_TRIAL]
        if len(member_runs) != trials:
            raise RuntimeError(f"{len(member_runs)} trial runs, expected the plan's {trials}")
        member0 = min(member_runs, key=lambda r: r.info.start_time)
        epochs_logged = sorted(client.get_metric_history(member0.info.run_id, "val/loss"),
                               key=lambda m: m.step)
    starts = sorted(r.info.start_time / 1e3 for r in member_runs)
    ends = sorted(r.info.end_time / 1e3 for r in member_runs)
    events = [(created, name) for created, name in seen.values()]
    events += [(parent.info.start_time / 1e3, "the parent run made"),
               (starts[0], "first member run started"), (starts[-1], "last member run started"),
               (ends[0], "first member run ended"), (ends[-1], "last member run ended"),
               (parent.info.end_time / 1e3, "the parent run ended"), (exited, "the driver exited")]
    events += [(m.timestamp / 1e3, f"member 0: epoch {m.step} metrics logged") for m in epochs_logged]
    worker = min((created for created, name in seen.values() if name.startswith("Ray worker")),
                 default=float("nan"))
    bounds = {"driver and Ray up": (launched, worker), "trial worker to its members' runs": (worker, starts[0]),
              "training": (starts[0], ends[-1]), "the end": (ends[-1], exited), "whole sweep": (launched, exited)}
    phases = {name: end - start for name, (start, end) in bounds.items()}
    what = (f"{spec_path}, {trials} trials" if spec_path else
            f"{members} members as one cohort, {epochs} epochs, {train_size} train examples")
    store = "a fresh sqlite store" if fresh_store else "a sqlite store with its tables made"
    print(f"== sweep timeline: {what}; ksweep sweep run, {store}, {os.cpu_count()} CPUs, "
          f"1-min load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    for at, name in sorted(events):
        print(f"  {at - launched:7.2f} s  {name}")
    print(f"  phases (and the CPUs the sweep kept busy in each, of {os.cpu_count()}):")
    for name, seconds in phases.items():
        print(f"    {name:<36s} {seconds:6.2f} s   {_cpus_busy(busy, *bounds[name]):4.2f} CPUs")
    by_name = cpu_by_name(cpu)
    total = sum(by_name.values())
    # On a CPU-bound machine the wall follows the CPU: this says what a cut would save.
    print(f"  CPU seconds by process (at least: sampled every 20 ms): {total:.2f} in all")
    for name, seconds in by_name.items():
        print(f"    {name:<36s} {seconds:6.2f} s")
    return phases, by_name


def main(members: int = 16, epochs: int = 2, train_size: int = 256, spec_path: Path | None = None,
         fresh_store: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    return run_timeline(members, epochs, train_size, spec_path, fresh_store)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=256)
    parser.add_argument("--spec", type=Path, default=None, help="time this sweep spec instead")
    parser.add_argument("--fresh-store", action="store_true",
                        help="let the sweep make the MLflow store's tables (a first sweep)")
    args = parser.parse_args()
    main(args.members, args.epochs, args.train_size, args.spec, args.fresh_store)

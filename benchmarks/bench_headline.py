"""Headline: a 32-row sweep by ``ksweep sweep run`` against the script a researcher wires by hand.

The sweep: the quickstart task, alpha {0, 0.5, 1, 2} x stacks {uniform, raw_plus_ncc, ncc,
raw_token_weighted} x 2 seeds, discrete model, fixed epochs (no early stopping: patience off,
min_epochs = epochs), two trials at a time on 2 CPUs. ``ksweep`` runs the deduplicated plan
(objective-identical rows share one trial; printed) and, as a third variant, every row
(``search.dedup: false``). The baseline is :mod:`benchmarks.handwired_tune` (Tune function
trainable with the project's trainer, one trial per actor, Ray's ``MLflowLoggerCallback``).

Every run is a whole process (imports, Ray start, MLflow store, report included), in the
order K H N N H K (ksweep, hand-wired, no-dedup), so drift over the runs hits all alike.
Printed: each run's wall time, the means, the ratios to the hand-wired script, rows (the
sweep's grid points, the same for all) per hour, and the 1-minute load average before each
run (the machine may be shared). Goal: ksweep <= 0.33x the hand-wired wall time.

    python -m benchmarks.bench_headline              # the full 32-row sweep (8 epochs)
    python -m benchmarks.bench_headline --short      # 16 rows, 2 epochs: a quick check
    python -m benchmarks.bench_headline --cohort-size 8   # resources.cohort_size, if the spec has it
    python -m benchmarks.bench_headline --floor      # ksweep against the compute floor, K F F K

``--floor`` measures what no tool can go below on this machine for the deduplicated plan: its
cohorts trained by the bare cohort loop (``Cohort.create(configs).run()``: no Ray, Tune,
MLflow, checkpoints or report), one whole process per cohort, as many at a time as the plan
runs cohorts at once, each with torch on one thread (as Ray gives a trial actor). Printed: its
wall (launch of the first process to the end of the last), the longest loop inside them (the
compute alone), and ksweep's wall against both, alternating K F F K.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from sweeps.plan.build import build_plan
from sweeps.spec import SweepSpec, load_sweep_spec
from sweeps.spec.sections import ResourcesSpec

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
NUM_CPUS = 2
GOAL = 0.33
STACKS = ["uniform", "raw_plus_ncc", "ncc", "raw_token_weighted"]


def headline_spec(short: bool = False, dedup: bool = True, cohort_size: Any = None) -> SweepSpec:
    data = load_sweep_spec(QUICKSTART).model_dump(mode="json")
    epochs = 2 if short else data["template"]["training"]["epochs"]
    data.update(name="bench-headline", alpha=[0.0, 1.0] if short else [0.0, 0.5, 1.0, 2.0],
                loss_stacks=STACKS, models=["discrete"], seeds=2)
    data["template"]["training"].update(epochs=epochs, patience=None, min_epochs=epochs)
    data["search"]["dedup"] = dedup
    data["budget"]["max_concurrent_trials"] = NUM_CPUS
    data["resources"] = {"cpu": 1.0, "gpu": 0.0}
    if cohort_size is not None and "cohort_size" in ResourcesSpec.model_fields:
        data["resources"]["cohort_size"] = cohort_size
    return SweepSpec.model_validate(data)


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlflow.db",
            "KSWEEP_SWEEP_ROOT": str(root / "ksweep"), "RAY_ADDRESS": "",
            "PYTHONPATH": str(ROOT)}


def _timed(command: list[str], root: Path) -> float:
    """Wall seconds of one whole process, run in its own fresh folder."""
    root.mkdir(parents=True)
    started = time.perf_counter()
    done = subprocess.run(command, env=_env(root), cwd=root, capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command[2:4]} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                           f"\n{done.stderr[-3000:]}")
    return wall


def _write(spec: SweepSpec, path: Path) -> Path:
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    return path


def headline(short: bool = False, cohort_size: Any = None) -> dict[str, float]:
    specs = {"ksweep": headline_spec(short, True, cohort_size),
             "handwired": headline_spec(short, True, cohort_size),
             "ksweep_nodedup": headline_spec(short, False, cohort_size)}
    plans = {name: build_plan(spec) for name, spec in specs.items()}
    rows = plans["ksweep"].trials_requested
    epochs = specs["ksweep"].template.training.epochs
    walls: dict[str, list[float]] = {name: [] for name in specs}
    loads: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-headline-") as tmp:
        files = {name: _write(spec, Path(tmp) / f"{name}.yaml") for name, spec in specs.items()}
        commands = {
            "ksweep": [sys.executable, "-m", "ksweep.cli", "sweep", "run", str(files["ksweep"]),
                       "--num-cpus", str(NUM_CPUS)],
            "ksweep_nodedup": [sys.executable, "-m", "ksweep.cli", "sweep", "run",
                               str(files["ksweep_nodedup"]), "--num-cpus", str(NUM_CPUS)],
            "handwired": [sys.executable, "-m", "benchmarks.handwired_tune",
                          str(files["handwired"]), "--num-cpus", str(NUM_CPUS), "--storage", "."],
        }
        order = ["ksweep", "handwired", "ksweep_nodedup", "ksweep_nodedup", "handwired", "ksweep"]
        for index, name in enumerate(order):
            loads.append(f"{os.getloadavg()[0]:.1f}")
            walls[name].append(_timed(commands[name], Path(tmp) / f"{index}-{name}"))
            print(f"  run {index + 1}/{len(order)} {name:<15s} {walls[name][-1]:7.1f} s "
                  f"(load before {loads[-1]})", flush=True)
    means = {name: statistics.fmean(values) for name, values in walls.items()}
    cohort = specs["ksweep"].resources.model_dump().get("cohort_size", "n/a (no such field)")
    print(f"\n== headline: {rows} rows ({'short' if short else 'full'}), {epochs} epochs, "
          f"{NUM_CPUS} at a time on {NUM_CPUS} CPUs; cohort_size {cohort}; order "
          f"{' '.join(n[0].upper() if n != 'ksweep_nodedup' else 'N' for n in order)}")
    print(f"  trials: ksweep {plans['ksweep'].trial_count} (dedup saved "
          f"{plans['ksweep'].trials_saved_by_dedup}), ksweep without dedup "
          f"{plans['ksweep_nodedup'].trial_count}, hand-wired {rows}")
    print(f"  1-min load average before each run: {', '.join(loads)} on {os.cpu_count()} CPUs")
    for name, values in walls.items():
        print(f"  {name:<15s} mean {means[name]:7.1f} s (runs: "
              f"{', '.join(f'{v:.1f}' for v in values)})   {rows / means[name] * 3600:7.0f} rows/hour")
    ratio = means["ksweep"] / means["handwired"]
    print(f"  ksweep / hand-wired: {ratio:.3f}x (goal <= {GOAL:.2f}x: "
          f"{'met' if ratio <= GOAL else 'NOT met'});  without dedup: "
          f"{means['ksweep_nodedup'] / means['handwired']:.3f}x")
    return means


def _floor_run(spec_path: Path, plan: Any, root: Path) -> tuple[float, float, int]:
    """The plan's cohorts by the bare cohort loop (``bench_member_overhead --bare --cohort I``),
    ``plan.max_concurrent`` processes at a time:
    (wall from the first launch to the last exit, the longest loop inside them, members trained)."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    root.mkdir(parents=True)
    env = {**_env(root), "OMP_NUM_THREADS": "1"}

    def one(index: int) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_member_overhead", "--bare",
                               str(spec_path), "--cache", str(root / f"cache-{index}"),
                               "--cohort", str(index)],
                              env=env, cwd=root, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"bare cohort {index} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    started = time.perf_counter()
    with ThreadPoolExecutor(plan.max_concurrent) as pool:
        cohorts = list(pool.map(one, range(len(plan.cohorts))))
    return (time.perf_counter() - started, max(c["loop_wall"] for c in cohorts),
            sum(c["members"] for c in cohorts))


def floor(short: bool = False, cohort_size: Any = None) -> dict[str, float]:
    """ksweep's whole process against the plan's compute floor, alternating K F F K."""
    spec = headline_spec(short, True, cohort_size)
    plan = build_plan(spec)
    walls: dict[str, list[float]] = {"ksweep": [], "floor": []}
    loops: list[float] = []
    loads: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-headline-floor-") as tmp:
        path = _write(spec, Path(tmp) / "ksweep.yaml")
        command = [sys.executable, "-m", "ksweep.cli", "sweep", "run", str(path), "--num-cpus", str(NUM_CPUS)]
        for index, name in enumerate(["ksweep", "floor", "floor", "ksweep"]):
            loads.append(f"{os.getloadavg()[0]:.1f}")
            folder = Path(tmp) / f"{index}-{name}"
            if name == "ksweep":
                walls[name].append(_timed(command, folder))
            else:
                wall, loop, _ = _floor_run(path, plan, folder)
                walls[name].append(wall)
                loops.append(loop)
            print(f"  run {index + 1}/4 {name:<7s} {walls[name][-1]:7.1f} s (load before {loads[-1]})", flush=True)
    means = {name: statistics.fmean(values) for name, values in walls.items()}
    loop = statistics.fmean(loops)
    print(f"\n== compute floor: the {plan.trial_count} trials of {plan.trials_requested} rows as "
          f"{len(plan.cohorts)} cohorts of up to {plan.cohort_size}, {plan.max_concurrent} at a time; "
          f"{spec.template.training.epochs} epochs; order K F F K")
    print(f"  1-min load average before each run: {', '.join(loads)} on {os.cpu_count()} CPUs")
    print(f"  ksweep  mean {means['ksweep']:7.1f} s (runs: {', '.join(f'{v:.1f}' for v in walls['ksweep'])})")
    print(f"  floor   mean {means['floor']:7.1f} s (runs: {', '.join(f'{v:.1f}' for v in walls['floor'])}), "
          f"of which the longest cohort loop {loop:.1f} s (compute alone)")
    print(f"  ksweep / floor: {means['ksweep'] / means['floor']:.2f}x the whole processes, "
          f"{means['ksweep'] / loop:.2f}x the compute alone")
    return {**means, "loop": loop}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ksweep vs a hand-wired Tune script, 32 rows.")
    parser.add_argument("--short", action="store_true", help="16 rows x 2 epochs")
    parser.add_argument("--cohort-size", default=None,
                        help="resources.cohort_size ('auto' or an integer) where the spec has it")
    parser.add_argument("--floor", action="store_true",
                        help="ksweep against the plan's cohorts by the bare cohort loop, K F F K")
    args = parser.parse_args(argv)
    size = args.cohort_size
    size = int(size) if size and size.isdigit() else size
    (floor if args.floor else headline)(args.short, size)


if __name__ == "__main__":
    main()

"""Sweep driver overhead: the same trials by a bare Ray Tune script and by `ksweep sweep run`.

Both variants run the same four trials (alpha {0, 1} x stacks {uniform, raw_plus_ncc} on the
quickstart task) on one local Ray, two at a time with one CPU each. The bare variant is a
plain Tune function trainable: the trial config from ``spec.trial_config``, ``Trainer.run_epoch``
and ``tune.report`` per epoch, no checkpoint, no MLflow, with the same actor reuse as the
driver (so the ratio prices the driver's own work, not a different Tune set-up). The ksweep
variant is ``sweeps.runner.run_sweep`` (MLflow parent and child runs, per-epoch checkpoints,
PNGs, report). They run in turn after one warm-up of each, so machine drift hits both alike.

Goals: ksweep wall time at most 1.05x the bare script's at cohort size 1, and a per-trial
overhead of at most 0.2 s. Printed too: each variant's efficiency, sum of trial times /
(wall x parallel slots), with a trial's time being Tune's ``time_total_s`` (start of the
trainable to its last report), and the 1-minute load average (the machine may be shared).

    python -m benchmarks.bench_sweep [--rounds N] [--cohort-size K]   (K: where the spec has
    resources.cohort_size; ignored, and said so, before that field exists)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from mlflow.tracking import MlflowClient
from ray import tune

from sweeps.runner import run_sweep
from sweeps.spec import SweepSpec, load_sweep_spec
from sweeps.spec.sections import ResourcesSpec
from workers.tracking import ensure_experiment
from workers.train import Trainer

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
NUM_CPUS = 2
GOAL = 1.05
OVERHEAD_GOAL_S = 0.2


def bench_spec(alpha: tuple[float, ...] = (0.0, 1.0), epochs: int | None = None,
               cohort_size: Any = None) -> SweepSpec:
    """The quickstart sweep cut to alpha x {ncc, raw_plus_ncc}: 4 trials by default (no two
    of them share an objective, so the bare grid and the deduplicated plan run the same)."""
    data = load_sweep_spec(QUICKSTART).model_dump(mode="json")
    data.update(name="bench-sweep", alpha=list(alpha), loss_stacks=["ncc", "raw_plus_ncc"],
                models=["discrete"], seeds=1)
    if epochs is not None:
        data["template"]["training"]["epochs"] = epochs
    data["budget"]["max_concurrent_trials"] = NUM_CPUS
    data["resources"] = {"cpu": 1.0, "gpu": 0.0}
    if cohort_size is not None and "cohort_size" in ResourcesSpec.model_fields:
        data["resources"]["cohort_size"] = cohort_size
    return SweepSpec.model_validate(data)


def _bare_trial(params: dict[str, Any], *, spec: SweepSpec, cache_root: str) -> None:
    """What a hand-written Tune script would do: train and report, nothing else."""
    config = spec.trial_config(
        float(params["alpha"]), str(params["loss_stack"]), str(params["model"]), int(params["seed"])
    )
    trainer = Trainer.create(config, cache_root)
    while trainer.epoch < config.training.epochs:
        tune.report(trainer.run_epoch())


@dataclass
class SweepTiming:
    wall_s: float
    trial_s: list[float]  # Tune's time_total_s of each trial

    def efficiency(self, slots: int) -> float:
        return sum(self.trial_s) / (self.wall_s * slots)


def run_bare(spec: SweepSpec, root: Path) -> SweepTiming:
    trainable = tune.with_resources(
        tune.with_parameters(_bare_trial, spec=spec, cache_root=str(root / "cache")),
        {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
    )
    tuner = tune.Tuner(
        trainable,
        param_space={
            "alpha": tune.grid_search(spec.alpha_values()),
            "loss_stack": tune.grid_search(spec.stack_labels()),
            "model": tune.grid_search(list(spec.models)),
            "seed": tune.grid_search(spec.seed_list()),
        },
        # The same Tune set-up as run_sweep (actor reuse), so the ratio is the price of the
        # spec, MLflow, checkpoints, PNGs and progress.
        tune_config=tune.TuneConfig(num_samples=1, reuse_actors=True,
                                    max_concurrent_trials=spec.budget.max_concurrent_trials),
        run_config=tune.RunConfig(name="bare", storage_path=str(root), verbose=0),
    )
    started = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - started
    if results.errors or len(results) != spec.trial_count():
        raise RuntimeError(f"bare sweep: {len(results.errors)} of {len(results)} trials failed: "
                           f"{results.errors[:1]}")
    return SweepTiming(wall, [float(r.metrics["time_total_s"]) for r in results])


@contextmanager
def _restored_environ() -> Iterator[None]:
    """run_sweep sets Tune's env knobs with setdefault; keep them out of the bare runs."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


def run_ksweep(spec: SweepSpec, root: Path, tracking_uri: str, sweep_id: str) -> SweepTiming:
    with _restored_environ():
        started = time.perf_counter()
        outcome = run_sweep(spec, sweep_id=sweep_id, sweep_root=root, tracking_uri=tracking_uri,
                            num_cpus=NUM_CPUS)
        wall = time.perf_counter() - started
    states = [o.state for o in outcome.outcomes]
    if outcome.status.state != "succeeded" or states.count("done") != spec.trial_count():
        raise RuntimeError(f"ksweep sweep {sweep_id}: {outcome.status.state}, trials {states}")
    return SweepTiming(wall, [o.final["time_total_s"] for o in outcome.outcomes])


def sweep_overhead(rounds: int = 2, cohort_size: Any = None) -> None:
    spec = bench_spec(cohort_size=cohort_size)
    trials, slots = spec.trial_count(), spec.budget.max_concurrent_trials or NUM_CPUS
    saved_uri = os.environ.get("MLFLOW_TRACKING_URI")
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = Path(tmp)
        tracking_uri = f"sqlite:///{root}/mlflow.db"
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
        # Artifacts under the temp folder, not ./mlruns of the working directory.
        ensure_experiment(MlflowClient(tracking_uri=tracking_uri), spec.name,
                          artifact_location=(root / "artifacts").as_uri())
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        try:
            runs = {
                "bare": lambda s, i: run_bare(s, root / f"bare-{i}"),
                "ksweep": lambda s, i: run_ksweep(s, root / "sweeps", tracking_uri, f"bench-{i}"),
            }
            warmup = bench_spec(alpha=(0.0,), epochs=1)  # driver imports, MLflow schema, Tune
            for run in runs.values():
                run(warmup, 0)
            samples: dict[str, list[SweepTiming]] = {name: [] for name in runs}
            for i in range(1, rounds + 1):
                for name, run in runs.items():
                    samples[name].append(run(spec, i))
                    loads.append(os.getloadavg()[0])
        finally:
            if started_ray:
                ray.shutdown()
            if saved_uri is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = saved_uri
    print(f"\n== sweep driver overhead: {trials} trials x {spec.template.training.epochs} epochs, "
          f"{slots} at a time on {NUM_CPUS} CPUs (quickstart task); {rounds} rounds after warm-up; "
          f"cohort_size {spec.resources.model_dump().get('cohort_size', 'n/a (no such field)')}")
    print(f"  1-min load average before and after each run: {', '.join(f'{x:.1f}' for x in loads)}"
          f" on {os.cpu_count()} CPUs (other work on the machine skews these figures)")
    walls = {name: statistics.median(t.wall_s for t in timings) for name, timings in samples.items()}
    for name, timings in samples.items():
        each = ", ".join(f"{t.wall_s:.2f}" for t in timings)
        efficiency = statistics.median(t.efficiency(slots) for t in timings)
        mean_trial = statistics.median(statistics.fmean(t.trial_s) for t in timings)
        print(f"  {name:<7s} wall {walls[name]:7.2f} s (runs: {each})   mean trial "
              f"{mean_trial:6.2f} s   efficiency {efficiency:6.1%}")
    ratio = walls["ksweep"] / walls["bare"]
    verdict = "met" if ratio <= GOAL else "NOT met"
    print(f"  wall ksweep / bare: {ratio:.3f}x  (goal <= {GOAL:.2f}x: {verdict})")
    overhead = (walls["ksweep"] - walls["bare"]) / trials
    print(f"  per-trial overhead: {overhead:+.2f} s  (goal <= {OVERHEAD_GOAL_S:.1f} s: "
          f"{'met' if overhead <= OVERHEAD_GOAL_S else 'NOT met'})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="run_sweep vs a bare Tune script, 4 trials.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cohort-size", default=None,
                        help="resources.cohort_size ('auto' or an integer) where the spec has it")
    args = parser.parse_args(argv)
    size = args.cohort_size
    sweep_overhead(args.rounds, int(size) if size and size.isdigit() else size)


if __name__ == "__main__":
    main()

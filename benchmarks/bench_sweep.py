"""Sweep driver overhead: the same trials by a bare Ray Tune script and by `ksweep sweep run`.

Both variants run the same four trials (alpha {0, 1} x stacks {ncc, raw_plus_ncc} on the
quickstart task) as lone trials (``resources.cohort_size: 1``) on one local Ray, two at a time
with one CPU each. The bare variant is a plain Tune function trainable
(``benchmarks/bare_trial.py``, a module that imports only Ray Tune, the spec and the trainer,
as a hand-written script would): the trial config from ``spec.trial_config``,
``Trainer.run_epoch`` and ``tune.report`` per epoch, no checkpoint, no MLflow, with the same
actor reuse as the driver (so the ratio prices the driver's own work, not a different Tune
set-up), under Tune's defaults. The ksweep variant is ``sweeps.tune.runner.run_sweep`` (MLflow
parent and child runs, per-epoch checkpoints, PNGs, report) under the Tune settings a real
driver runs with (``service.orchestrator.driver_env.TUNE_ENV``, as ``ksweep sweep run`` and the launchers set
them). They run in turn after one warm-up of each, so machine drift hits both alike.

Goals: ksweep wall time at most 1.05x the bare script's at cohort size 1, and a per-trial
overhead, (ksweep wall - bare wall) / trials, of at most 0.2 s. Printed too: each variant's
mean trial time (Tune's ``time_total_s``: start of the trainable to its last report, so a
trial's PNGs and run end, after its last report, are not in it), its efficiency, sum of trial
times / (wall x parallel slots), ksweep's driver time outside Tune (parent run, status, report)
and the 1-minute load average (the machine may be shared). ``--profile`` adds where each
trial's time goes, phase by phase (``benchmarks/sweep_profile.py``).

    python -m benchmarks.bench_sweep [--rounds N] [--cohort-size K] [--profile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from mlflow.tracking import MlflowClient
from ray import tune

import sweeps.tune.segment_run
from benchmarks import sweep_profile
from benchmarks.bare_trial import bare_trial
from service.orchestrator.driver_env import TUNE_ENV
from sweeps.plan.build import build_plan
from sweeps.spec import SweepSpec, load_sweep_spec
from sweeps.tune.runner import SweepSettings, run_sweep
from workers.tracking.runs import ensure_experiment

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
NUM_CPUS = 2
GOAL = 1.05
OVERHEAD_GOAL_S = 0.2


def bench_spec(alpha: tuple[float, ...] = (0.0, 1.0), epochs: int | None = None,
               cohort_size: Any = 1) -> SweepSpec:
    """The quickstart sweep cut to alpha x {ncc, raw_plus_ncc}: 4 trials by default (no two
    of them share an objective, so the bare grid and the deduplicated plan run the same), as
    lone trials (``auto`` would train them as 2 cohorts of 2: not what the bare script does)."""
    data = load_sweep_spec(QUICKSTART).model_dump(mode="json")
    data.update(name="bench-sweep", alpha=list(alpha), loss_stacks=["ncc", "raw_plus_ncc"],
                models=["discrete"], seeds=1)
    if epochs is not None:
        data["template"]["training"]["epochs"] = epochs
    data["budget"]["max_concurrent_trials"] = NUM_CPUS
    data["resources"] = {"cpu": 1.0, "gpu": 0.0, "cohort_size": cohort_size}
    return SweepSpec.model_validate(data)


@dataclass
class SweepTiming:
    wall_s: float
    trial_s: list[float]  # Tune's time_total_s of each trial
    started: float = 0.0  # epoch seconds, for the profile's timeline
    ended: float = 0.0
    driver_s: float = 0.0  # ksweep: run_sweep's time outside Tuner.fit
    driver_cpu_s: float = 0.0  # this (driver) process's CPU seconds, all threads
    profile: list[dict[str, Any]] = field(default_factory=list)

    def efficiency(self, slots: int) -> float:
        return sum(self.trial_s) / (self.wall_s * slots)


def run_bare(spec: SweepSpec, root: Path, profile: bool = False) -> SweepTiming:
    function = sweep_profile.profiled_bare_trial if profile else bare_trial
    trainable = tune.with_resources(
        tune.with_parameters(function, spec=spec, cache_root=str(root / "cache")),
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
    started_at, started, cpu = time.time(), time.perf_counter(), time.process_time()
    results = tuner.fit()
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    if results.errors or len(results) != build_plan(spec).trial_count:
        raise RuntimeError(f"bare sweep: {len(results.errors)} of {len(results)} trials failed: "
                           f"{results.errors[:1]}")
    return SweepTiming(wall, [float(r.metrics["time_total_s"]) for r in results],
                       started_at, started_at + wall, driver_cpu_s=cpu)


@contextmanager
def _driver_environ() -> Iterator[None]:
    """The Tune knobs a real ksweep driver runs with, for this run only (not the bare's)."""
    saved = dict(os.environ)
    for name, value in TUNE_ENV.items():
        os.environ.setdefault(name, value)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


@contextmanager
def _timed_fit(seconds: list[float]) -> Iterator[None]:
    """Time run_sweep's Tuner.fit, so the driver's own time around it can be told apart."""
    fit = sweeps.tune.segment_run._fit

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fit(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - started)

    sweeps.tune.segment_run._fit = timed
    try:
        yield
    finally:
        sweeps.tune.segment_run._fit = fit


@contextmanager
def _profiled_trainable(profile: bool) -> Iterator[None]:
    trainable = sweeps.tune.segment_run.train_sweep_trial
    if profile:
        sweeps.tune.segment_run.train_sweep_trial = sweep_profile.profiled_sweep_trial
    try:
        yield
    finally:
        sweeps.tune.segment_run.train_sweep_trial = trainable


def run_ksweep(spec: SweepSpec, root: Path, tracking_uri: str, sweep_id: str,
               profile: bool = False) -> SweepTiming:
    fit_s: list[float] = []
    with _driver_environ(), _timed_fit(fit_s), _profiled_trainable(profile):
        started_at, started, cpu = time.time(), time.perf_counter(), time.process_time()
        outcome = run_sweep(spec, build_plan(spec), SweepSettings(
            sweep_id=sweep_id, sweep_root=root, tracking_uri=tracking_uri, num_cpus=NUM_CPUS))
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
    states = [o.state for o in outcome.outcomes]
    if outcome.status.state != "succeeded" or states.count("done") != build_plan(spec).trial_count:
        raise RuntimeError(f"ksweep sweep {sweep_id}: {outcome.status.state}, trials {states}")
    # A cohort's members carry no Tune time of their own (NaN: --cohort-size auto or > 1).
    return SweepTiming(wall, [o.final.get("time_total_s", float("nan")) for o in outcome.outcomes],
                       started_at, started_at + wall, driver_s=wall - sum(fit_s),
                       driver_cpu_s=cpu)


def _print_results(samples: dict[str, list[SweepTiming]], trials: int, slots: int) -> None:
    for name, timings in samples.items():
        each = ", ".join(f"{t.wall_s:.2f}" for t in timings)
        efficiency = statistics.median(t.efficiency(slots) for t in timings)
        mean_trial = statistics.median(statistics.fmean(t.trial_s) for t in timings)
        driver_cpu = statistics.median(t.driver_cpu_s for t in timings)
        wall = statistics.median(t.wall_s for t in timings)
        print(f"  {name:<7s} wall {wall:7.2f} s (runs: {each})   mean trial "
              f"{mean_trial:6.2f} s   efficiency {efficiency:6.1%}   driver CPU {driver_cpu:5.2f} s")
    driver = statistics.median(t.driver_s for t in samples["ksweep"])
    print(f"  ksweep's driver outside Tune (parent run, status, report): {driver:.2f} s per run")
    # Each round's two runs ran back to back: their ratio is the figure least moved by the
    # machine's drift (the medians of the walls above may come from different rounds).
    pairs = list(zip(samples["bare"], samples["ksweep"], strict=True))
    ratio = statistics.median(k.wall_s / b.wall_s for b, k in pairs)
    verdict = "met" if ratio <= GOAL else "NOT met"
    print(f"  wall ksweep / bare, median of the rounds: {ratio:.3f}x  (goal <= {GOAL:.2f}x: "
          f"{verdict}); per round: " + ", ".join(f"{k.wall_s / b.wall_s:.2f}x" for b, k in pairs))
    overhead = statistics.median((k.wall_s - b.wall_s) / trials for b, k in pairs)
    print(f"  per-trial overhead, (ksweep wall - bare wall) / {trials} trials, median of the "
          f"rounds: {overhead:+.2f} s  (goal <= {OVERHEAD_GOAL_S:.1f} s: "
          f"{'met' if overhead <= OVERHEAD_GOAL_S else 'NOT met'}); per round: "
          + ", ".join(f"{(k.wall_s - b.wall_s) / trials:+.2f}" for b, k in pairs))


def sweep_overhead(rounds: int = 2, cohort_size: Any = 1, profile: bool = False) -> None:
    spec = bench_spec(cohort_size=cohort_size)
    trials, slots = build_plan(spec).trial_count, spec.budget.max_concurrent_trials or NUM_CPUS
    saved_uri = os.environ.get("MLFLOW_TRACKING_URI")
    saved_profile_dir = os.environ.get(sweep_profile.PROFILE_DIR_ENV)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = Path(tmp)
        tracking_uri = f"sqlite:///{root}/mlflow.db"
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
        # Trial processes inherit it from the raylet, which ray.init starts below.
        os.environ[sweep_profile.PROFILE_DIR_ENV] = str(root)
        # Artifacts under the temp folder, not ./mlruns of the working directory.
        ensure_experiment(MlflowClient(tracking_uri=tracking_uri), spec.name,
                          artifact_location=(root / "artifacts").as_uri())
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(address="local", num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        try:
            runs: dict[str, Callable[[SweepSpec, int], SweepTiming]] = {
                "bare": lambda s, i: run_bare(s, root / f"bare-{i}", profile),
                "ksweep": lambda s, i: run_ksweep(s, root / "sweeps", tracking_uri, f"bench-{i}",
                                                  profile),
            }
            warmup = bench_spec(alpha=(0.0,), epochs=1)  # driver imports, MLflow schema, Tune
            for run in runs.values():
                run(warmup, 0)
            samples: dict[str, list[SweepTiming]] = {name: [] for name in runs}
            for i in range(1, rounds + 1):
                for name, run in runs.items():
                    timing = run(spec, i)
                    if profile:
                        timing.profile = sweep_profile.read_records(root, name, timing.started,
                                                                    timing.ended)
                    samples[name].append(timing)
                    loads.append(os.getloadavg()[0])
        finally:
            if started_ray:
                ray.shutdown()
            for name, value in ((sweep_profile.PROFILE_DIR_ENV, saved_profile_dir),
                                ("MLFLOW_TRACKING_URI", saved_uri)):
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    print(f"\n== sweep driver overhead: {trials} trials x {spec.template.training.epochs} epochs, "
          f"{slots} at a time on {NUM_CPUS} CPUs (quickstart task); {rounds} rounds after warm-up; "
          f"cohort_size {spec.resources.cohort_size}")
    print(f"  1-min load average before and after each run: {', '.join(f'{x:.1f}' for x in loads)}"
          f" on {os.cpu_count()} CPUs (other work on the machine skews these figures)")
    _print_results(samples, trials, slots)
    if profile:
        timelines = {name: [(t.profile, sweep_profile.timeline(t.profile, t.started, t.ended))
                            for t in timings] for name, timings in samples.items()}
        sweep_profile.summarise(timelines)
        # CPU seconds drift less than wall seconds when other work shares the machine.
        cpu = {name: statistics.median(
            t.driver_cpu_s + line["worker processes' CPU (sum)"]
            for t, (_, line) in zip(samples[name], timelines[name], strict=True))
            for name in samples}
        print(f"  CPU per run, the driver + the trial processes (median): bare {cpu['bare']:.2f} s,"
              f" ksweep {cpu['ksweep']:.2f} s: {(cpu['ksweep'] - cpu['bare']) / trials:+.2f} "
              f"CPU-s per trial")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="run_sweep vs a bare Tune script, 4 trials.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cohort-size", default="1",
                        help="resources.cohort_size of the ksweep run ('auto' or an integer; "
                             "default 1, the lone trials the bare script runs)")
    parser.add_argument("--profile", action="store_true",
                        help="time each trial's phases in the trial processes (sweep_profile.py)")
    args = parser.parse_args(argv)
    size = args.cohort_size
    sweep_overhead(args.rounds, int(size) if size.isdigit() else size, args.profile)


if __name__ == "__main__":
    main()

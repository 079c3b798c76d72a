"""One sweep trial's cost by the way it runs: a lone Tune trial against a cohort of one (K = 1).

Both run the sweep's real Tune function (``sweeps.tune.trial_entry.train_sweep_trial``) in this
process, without Ray: ``ray.tune``'s session calls (``get_context``, ``get_checkpoint``,
``report``) answer as a fresh trial's would, so each run makes its MLflow run on a sqlite store
in a temporary folder, trains the quickstart sweep's trial config (alpha 1,
``raw_token_weighted``, seed 0: 8 epochs, 1,024 training examples), checkpoints and reports
every epoch and ends its run. ``lone``: the trial's Tune config as a sweep of lone trials
(``resources.cohort_size: 1``) gives it, which since the one trainable is a cohort of one on
its lone trainer (the K = 1 trial); ``cohort K=1``: the same trial as the one member of a
stacked cohort (``members: [params]``, which no plan makes: a cohort of one runs as the first). The two alternate (``--repeats`` rounds after one warm-up
each), torch on one thread as Ray gives a trial, and each is printed as its median wall and
process-CPU seconds and their least (contention on a shared machine only adds), each with its
ratio to the first line.

``--baseline TREE`` also runs both in a second process on another checkout of the code (e.g.
``git worktree add /tmp/before COMMIT``), alternating with this checkout's, so a restructure is
measured against the code before it in one run. ``--sweep`` adds the quickstart sweep's whole
process (``ksweep sweep run sweeps/examples/quickstart.yaml --num-cpus 2``: launch to exit,
wall and the CPU of its waited-for processes).

    python -m benchmarks.bench_trial_path [--repeats 5] [--paths lone] [--baseline TREE] [--sweep] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
TRIAL = {"alpha": 1.0, "loss_stack": "raw_token_weighted", "seed": 0}
PATHS = ("lone", "cohort K=1")


class _Context:
    """Ray Tune's trial context, as much of it as the trainables read."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id

    def get_trial_id(self) -> str:
        return self.trial_id


@contextlib.contextmanager
def fake_tune_session(trial_id: str) -> Iterator[list[dict[str, Any]]]:
    """``ray.tune``'s session calls for a fresh trial (no checkpoint); yields the reports."""
    from ray import tune

    reports: list[dict[str, Any]] = []
    saved = {name: getattr(tune, name) for name in ("get_context", "get_checkpoint", "report")}
    tune.get_context = lambda: _Context(trial_id)
    tune.get_checkpoint = lambda: None
    tune.report = lambda metrics, checkpoint=None: reports.append(dict(metrics))
    try:
        yield reports
    finally:
        for name, value in saved.items():
            setattr(tune, name, value)


def _trial_params() -> tuple[Any, dict[str, Any]]:
    """The quickstart spec's trial configs and the plan's params of :data:`TRIAL`."""
    from sweeps.plan.budget import build_plan_within_budget
    from sweeps.spec.loading import load_sweep_spec

    spec = load_sweep_spec(QUICKSTART)
    plan = build_plan_within_budget(spec)
    for index, trial in enumerate(plan.trials):
        if all(trial.get(k) == v for k, v in TRIAL.items()):
            params = {"trial_index": index, **{k: v for k, v in trial.items() if k != "shared_by"},
                      "shared_by": ",".join(trial["shared_by"])}
            return spec, params
    raise LookupError(f"no trial {TRIAL} in {QUICKSTART}")


def _context(spec: Any, folder: Path) -> Any:
    """What the driver hands every trial (a typed context where the code has one)."""
    values = {"tracking_uri": f"sqlite:///{folder / 'mlflow.db'}", "experiment_name": "trial-path",
              "sweep_id": uuid.uuid4().hex[:12], "parent_run_id": None,
              "cache_root": str(folder / "cache"), "metric": spec.primary_metric,
              "mode": spec.primary_mode, "trial_plots": spec.tracking.trial_plots}
    try:
        from sweeps.tune.trial_context import TrialContext
    except ImportError:  # the code before the typed context: a dict
        return values
    return TrialContext(**values)


def run_one(path: str, spec: Any, params: dict[str, Any], folder: Path) -> tuple[float, float]:
    """One trial by ``path`` (:data:`PATHS`), start to end: (wall s, process CPU s)."""
    from sweeps.tune.trial_entry import train_sweep_trial

    context = _context(spec, folder)
    tune_params = params if path == "lone" else {"cohort_index": 0, "members": [params]}
    with fake_tune_session(uuid.uuid4().hex[:8]) as reports:
        wall, cpu = time.perf_counter(), time.process_time()
        train_sweep_trial(tune_params, configs=spec.trial_configs(), context=context)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    epochs = spec.template.training.epochs
    if len(reports) != epochs:
        raise RuntimeError(f"{path}: {len(reports)} reports, expected {epochs}")
    return wall, cpu


def measure(repeats: int, paths: tuple[str, ...] = PATHS) -> dict[str, list[tuple[float, float]]]:
    """Each of ``paths`` ``repeats`` times, alternating (A B B A ...), after one warm-up each."""
    import torch

    torch.set_num_threads(1)
    spec, params = _trial_params()
    samples: dict[str, list[tuple[float, float]]] = {path: [] for path in paths}
    with tempfile.TemporaryDirectory(prefix="bench-trial-path-") as tmp:
        for path in paths:
            run_one(path, spec, params, Path(tmp))  # imports, the MLflow schema, the caches
        for index in range(repeats):
            for path in (paths if index % 2 == 0 else paths[::-1]):
                samples[path].append(run_one(path, spec, params, Path(tmp)))
    return samples


def _child(tree: Path, repeats: int, paths: tuple[str, ...]) -> dict[str, list[tuple[float, float]]]:
    """:func:`measure` in a fresh process on the code of ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_trial_path", "--child",
                           "--repeats", str(repeats), "--paths", *paths], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the run on {tree} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sweep_process(tree: Path) -> tuple[float, float]:
    """``ksweep sweep run`` of the quickstart sweep on ``tree``'s code: (wall s, the CPU s of its
    waited-for processes)."""
    # Imported here, in the parent only: a child process may run another tree's code.
    from benchmarks.bench_member_overhead import timed_process

    with tempfile.TemporaryDirectory(prefix="bench-trial-path-sweep-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1",
               "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db",
               "KSWEEP_SWEEP_ROOT": f"{tmp}/sweeps"}
        env.pop("RAY_ADDRESS", None)
        wall, cpu, _ = timed_process([sys.executable, "-m", "ksweep.cli", "sweep", "run",
                                      str(tree / "sweeps" / "examples" / "quickstart.yaml"),
                                      "--num-cpus", "2"], env, cwd=tree)
    return wall, cpu


def _median(values: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(w for w, _ in values), statistics.median(c for _, c in values)


def _least(values: list[tuple[float, float]]) -> tuple[float, float]:
    """The least wall and CPU: what a shared machine's contention adds to least."""
    return min(w for w, _ in values), min(c for _, c in values)


def _lines(label: str, samples: dict[str, list[tuple[float, float]]],
           reference: tuple[tuple[float, float], tuple[float, float]]) -> list[str]:
    lines = []
    for path, values in samples.items():
        wall, cpu = _median(values)
        least = _least(values)
        runs = ", ".join(f"{w:.2f}/{c:.2f}" for w, c in values)
        lines.append(f"  {label + ' ' + path:<26s} median wall {wall:6.2f} s ({wall / reference[0][0]:5.3f}x)  "
                     f"CPU {cpu:6.2f} s ({cpu / reference[0][1]:5.3f}x); least wall {least[0]:6.2f} s "
                     f"({least[0] / reference[1][0]:5.3f}x) CPU {least[1]:6.2f} s "
                     f"({least[1] / reference[1][1]:5.3f}x)   runs wall/CPU: {runs}")
    return lines


def main(repeats: int = 5, baseline: Path | None = None, sweep: bool = False,
         out: Path | None = None, paths: tuple[str, ...] = PATHS) -> list[str]:
    load = os.getloadavg()
    lines = [f"== bench_trial_path {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on "
             f"{platform.machine()} ({os.cpu_count()} CPUs, load {load[0]:.1f} {load[1]:.1f} "
             f"{load[2]:.1f} at the start), git {_commit(ROOT)}",
             f"   one quickstart trial ({TRIAL}), 8 epochs, torch on 1 thread, sqlite MLflow; "
             f"medians of {repeats} alternating runs; ratios to the first line"]
    print("\n".join(lines), flush=True)
    if baseline is None:
        results = {"this": measure(repeats, paths)}
    else:  # each checkout in its own process, alternating, the baseline first
        results = {"before": {p: [] for p in paths}, "this": {p: [] for p in paths}}
        rounds = max(1, repeats // 2)
        for index in range(rounds):
            order = [("before", baseline), ("this", ROOT)]
            for label, tree in (order if index % 2 == 0 else order[::-1]):
                for path, values in _child(tree, 2, paths).items():
                    results[label][path].extend(values)
        lines.append(f"   before = {baseline} (git {_commit(baseline)}), its own process; "
                     f"{rounds} rounds of 2 runs each, alternating with this checkout")
    first = next(iter(results.values()))
    reference = _median(first[paths[0]]), _least(first[paths[0]])
    for label, samples in results.items():
        lines.extend(_lines(label, samples, reference))
    if sweep:
        trees = [("before", baseline), ("this", ROOT)] if baseline is not None else [("this", ROOT)]
        for label, tree in trees:
            wall, cpu = sweep_process(tree)
            lines.append(f"  {label} ksweep sweep run quickstart.yaml (--num-cpus 2): wall {wall:6.1f} s, "
                         f"CPU of its waited-for processes {cpu:6.1f} s, load {os.getloadavg()[0]:.1f}")
    print("\n".join(lines[2:]), flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        print(f"written to {out}")
    return lines


def _commit(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--sweep", action="store_true", help="also the quickstart sweep's whole process")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS,
                        help="which ways to run the trial (default both)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.repeats, tuple(args.paths))))
    else:
        main(args.repeats, args.baseline, args.sweep, args.out, tuple(args.paths))

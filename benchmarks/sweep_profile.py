"""Where a sweep trial's time goes: ``python -m benchmarks.bench_sweep --profile``.

Both variants' trainables are wrapped (the wrappers live in this module, so Ray imports them
by reference in the trial process) and, in the trial process, the functions on a trial's path
are timed: the trainer's own work (``Trainer.create``, ``run_epoch``, ``finalize``) and what
ksweep adds around it (the MLflow run's start, per-epoch metrics, the checkpoint file, Tune's
copy of it, the PNGs, the run's end). ``tune.report`` is split into the checkpoint copy and
the wait for the driver to take the result (Tune's function trainables report synchronously:
the trial thread waits for the driver's next ``train`` call). Each trial appends one JSON
line to ``$KSWEEP_BENCH_PROFILE_DIR/trials.jsonl``; :func:`summarise` turns them into the
per-trial table. Wall seconds per phase, plus the trial thread's CPU seconds.

The timers cost a few microseconds per call (a few hundred calls per trial).
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROFILE_DIR_ENV = "KSWEEP_BENCH_PROFILE_DIR"
RECORDS = "trials.jsonl"

# (owner module, attribute path, phase). The ksweep phases are instrumented in ksweep trials
# only (the bare trial never imports MLflow or the plots, and must not for the profile either).
_TRAINER_PHASES = (
    ("workers.train.loop", "Trainer.create", "trainer create"),
    ("workers.train.loop", "Trainer.run_epoch", "train + evaluate epochs"),
    ("workers.train.loop", "Trainer.finalize", "finalize (selected, profiles)"),
    ("ray.train._internal.storage", "StorageContext.persist_current_checkpoint",
     "tune: copy the checkpoint"),
    ("ray.train._internal.session", "_TrainSession._report_training_result",
     "tune: wait for the driver"),
)
_KSWEEP_PHASES = (
    ("workers.train.loop", "Trainer.save_checkpoint", "checkpoint file"),
    ("workers.train.loop", "Trainer.load_checkpoint", "checkpoint load"),
    ("sweeps.tune.trainable", "TuneTrial.open_runs", "mlflow: start the run"),
    ("workers.tracking.runs", "RunLogger.log_metrics", "mlflow: epoch metrics"),
    ("workers.trial", "log_trial_plots", "five PNGs"),
    ("workers.tracking.runs", "RunLogger.finish", "mlflow: end the run"),
)
PHASES = tuple(phase for *_, phase in _TRAINER_PHASES + _KSWEEP_PHASES)
COLD_PHASES = ("trainer create", "mlflow: start the run", "five PNGs")

_state = threading.local()
_patched: set[tuple[str, str]] = set()


def _current() -> dict[str, float] | None:
    return getattr(_state, "phases", None)


def _timed(original: Callable[..., Any], phase: str) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        phases = _current()
        if phases is None or phases.get("_in") == phase:  # another thread, or a nested call
            return original(*args, **kwargs)
        started = time.perf_counter()
        outer = phases.get("_in")
        phases["_in"] = phase
        try:
            return original(*args, **kwargs)
        finally:
            phases["_in"] = outer
            phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - started

    return timed


def _instrument(specs: tuple[tuple[str, str, str], ...]) -> None:
    import importlib

    for module_name, path, phase in specs:
        if (module_name, path) in _patched:
            continue
        # Imported here if the trial has not yet: trials import the training stack lazily, so
        # a slot's first trial would otherwise go untimed.
        module = importlib.import_module(module_name)
        *owners, name = path.split(".")
        owner: Any = module
        for part in owners:
            owner = getattr(owner, part)
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if isinstance(original, classmethod):
            setattr(owner, name, classmethod(_timed(original.__func__, phase)))
        else:
            setattr(owner, name, _timed(original, phase))
        _patched.add((module_name, path))


def _profiled(kind: str, run: Callable[[], None], ksweep: bool) -> None:
    from ray import tune

    _instrument(_TRAINER_PHASES + (_KSWEEP_PHASES if ksweep else ()))
    _state.phases = phases = {}
    # process_time: this process's CPU (all threads) since it started, so at a slot's first
    # trial it holds what the actor's start cost (Ray's worker, the trainable's imports).
    started, cpu, process_cpu = time.time(), time.thread_time(), time.process_time()
    try:
        run()
    finally:
        ended = time.time()
        phases.pop("_in", None)
        _state.phases = None
        record = {"kind": kind, "trial_id": tune.get_context().get_trial_id(), "pid": os.getpid(),
                  "start": started, "end": ended, "wall_s": ended - started,
                  "cpu_s": time.thread_time() - cpu, "process_cpu_start": process_cpu,
                  "process_cpu_end": time.process_time(), "phases": phases}
        folder = Path(os.environ[PROFILE_DIR_ENV])
        with (folder / RECORDS).open("a") as out:
            out.write(json.dumps(record) + "\n")


def profiled_bare_trial(params: dict[str, Any], **kwargs: Any) -> None:
    from benchmarks.bare_trial import bare_trial

    _profiled("bare", lambda: bare_trial(params, **kwargs), ksweep=False)


def profiled_sweep_trial(params: dict[str, Any], **kwargs: Any) -> None:
    from sweeps.tune.trial_entry import train_sweep_trial

    _profiled("ksweep", lambda: train_sweep_trial(params, **kwargs), ksweep=True)


def read_records(folder: Path, kind: str, start: float, end: float) -> list[dict[str, Any]]:
    """The trial records of one variant's run (between ``start`` and ``end``, epoch seconds)."""
    path = folder / RECORDS
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["kind"] == kind and start <= r["start"] and r["end"] <= end]


def timeline(records: list[dict[str, Any]], start: float, end: float) -> dict[str, float]:
    """Per run: the wait from the run's start to each slot's first trial, the gaps between a
    slot's trials, and the time from the last trial's end to the run's end (means)."""
    slots: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        slots.setdefault(record["pid"], []).append(record)
    first, gaps, last, startup_cpu, worker_cpu = [], [], [], [], 0.0
    for trials in slots.values():
        trials.sort(key=lambda r: r["start"])
        first.append(trials[0]["start"] - start)
        startup_cpu.append(trials[0]["process_cpu_start"])
        worker_cpu += trials[-1]["process_cpu_end"]
        gaps.extend(b["start"] - a["end"] for a, b in zip(trials, trials[1:], strict=False))
        last.append(trials[-1]["end"])
    return {"to first trial (per slot)": statistics.fmean(first) if first else float("nan"),
            "between a slot's trials": statistics.fmean(gaps) if gaps else 0.0,
            "last trial's end to the end": end - max(last) if last else float("nan"),
            "process CPU before a slot's first trial": (statistics.fmean(startup_cpu)
                                                         if startup_cpu else float("nan")),
            "worker processes' CPU (sum)": worker_cpu,
            "slots": float(len(slots))}


def summarise(runs: dict[str, list[tuple[list[dict[str, Any]], dict[str, float]]]]) -> None:
    """Print mean seconds per trial by phase for each variant, and the difference."""
    names = list(runs)
    per_trial: dict[str, dict[str, float]] = {}
    for name, samples in runs.items():
        records = [r for rows, _ in samples for r in rows]
        if not records:
            continue
        n = len(records)
        row = {phase: sum(r["phases"].get(phase, 0.0) for r in records) / n for phase in PHASES}
        row["trial wall (trainable start to end)"] = sum(r["wall_s"] for r in records) / n
        row["  of which not timed above"] = row["trial wall (trainable start to end)"] - sum(
            row[p] for p in PHASES)
        row["trial thread CPU"] = sum(r["cpu_s"] for r in records) / n
        row["trial process CPU (all threads)"] = sum(
            r["process_cpu_end"] - r["process_cpu_start"] for r in records) / n
        # A slot's first trial pays the process's first-use costs (lazy imports, the MLflow
        # store's set-up); the later ones run warm.
        first = {min((r for r in rows if r["pid"] == pid), key=lambda r: r["start"])["start"]
                 for rows, _ in samples for pid in {r["pid"] for r in rows}}
        for phase in COLD_PHASES:
            for label, chosen in (("a slot's first trial", [r for r in records
                                                            if r["start"] in first]),
                                  ("later trials", [r for r in records if r["start"] not in first])):
                if chosen:
                    row[f"  {phase}: {label}"] = statistics.fmean(
                        r["phases"].get(phase, 0.0) for r in chosen)
        for key in ("to first trial (per slot)", "between a slot's trials",
                    "last trial's end to the end", "process CPU before a slot's first trial",
                    "worker processes' CPU (sum)"):
            row[key] = statistics.fmean(t[key] for _, t in samples)
        per_trial[name] = row
    if len(per_trial) < len(names):
        print("  (no profile records: the trial processes could not write them)")
        return
    print(f"\n  where the time goes, mean seconds per trial ({', '.join(names)}, difference):")
    keys = list(per_trial[names[0]])
    for key in keys:
        values = [per_trial[name][key] for name in names]
        if max(abs(v) for v in values) < 0.0005:
            continue
        cells = "".join(f"{v:9.3f}" for v in values)
        print(f"    {key:<50s}{cells}{values[-1] - values[0]:+9.3f}")
    print("    (the last five rows are per run or per slot, not per trial: each slot waits for its "
          "actor and imports once; the end includes ksweep's report; the worker processes' CPU "
          "is their whole life's, to their last trial's end)")

"""Where a cohort's time goes: one cohort at K = 1, 32, 128 on the CPU, phase by phase.

The cohort runs the way a sweep's trainable runs a cohort (sweeps/tune/trainable.py),
without Ray: ``Cohort.create``, one MLflow run per member (a sqlite store in a temporary
folder), then per epoch the cohort's training pass and each member's epoch end, one
``log_batch`` per member (queued for the writer thread, as a sweep's runs are), one checkpoint
per member, every run settled before the cohort's checkpoint would be reported (the cohort
trainable's order); at the end each member's
``finalize`` and its run's close (end state; the five PNGs only with ``--trial-plots``, as a
sweep's ``tracking.trial_plots``). Timers wrap the code from the outside (the methods are
wrapped for the run and restored after it; nothing changes in the library): each phase
counts its exclusive wall and process-CPU seconds (a phase inside another one is taken out of
the outer one), and the rest of the wall is ``other``. Phases:

- ``create``: ``Cohort.create`` (data, oracle b_t, models, kappa summaries, stacking);
- ``mlflow start``: the members' runs and params; ``train pass``: ``Cohort._train_pass``;
- ``write-back``: ``Cohort._sync_trainers``; ``restack``: ``Cohort._stack`` after creation;
- ``eval forward`` (the batched or lone forwards over the splits), ``eval read-outs``
  (``Trainer.evaluate_split`` less its forward), ``gradient shares``
  (``Trainer.gradient_readouts``);
- ``logging``: ``TrialRunner.log_epoch`` (queueing the batch); ``metrics wait``: waiting for
  the writer thread (``TrialRunner.settle``); ``checkpoints``: ``Cohort.save_checkpoint``;
- ``finalize``: ``Trainer.finalize``; ``plots + close``: ``finish_member_run``.

``python -m benchmarks.cohort_profile [--sizes 1 32 128] [--eval batched lone] [--trial-plots]
[--out FILE]``
prints a table per K and writes it to ``docs/bench/cohort_profile_cpu_<date>.txt`` by
default. Torch runs on one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from benchmarks.bench_cohort import sweep_configs

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("create", "mlflow start", "train pass", "write-back", "restack", "eval forward",
          "eval read-outs", "gradient shares", "logging", "metrics wait", "checkpoints", "finalize",
          "plots + close")


class PhaseTimer:
    """Exclusive wall and CPU seconds per phase (a nested phase is charged to itself only)."""

    def __init__(self) -> None:
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self._stack: list[list] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        frame = [time.perf_counter(), time.process_time(), 0.0, 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            wall, cpu = time.perf_counter() - frame[0], time.process_time() - frame[1]
            self.wall[name] += wall - frame[2]
            self.cpu[name] += cpu - frame[3]
            if self._stack:  # the parent does not count this child's time as its own
                self._stack[-1][2] += wall
                self._stack[-1][3] += cpu

    def wrap(self, owner: object, attribute: str, name: str | Callable[..., str]) -> Callable[[], None]:
        """Time every call of ``owner.attribute`` (a class's or a module's); returns the function
        that restores it."""
        original = owner.__dict__[attribute]
        function = original.__func__ if isinstance(original, staticmethod) else original

        def timed(*args, **kwargs):
            with self.phase(name(*args, **kwargs) if callable(name) else name):
                return function(*args, **kwargs)

        setattr(owner, attribute, staticmethod(timed) if isinstance(original, staticmethod) else timed)
        return lambda: setattr(owner, attribute, original)


def profile(size: int, cache: Path, *, epochs: int, train_size: int, batched: bool,
            trial_plots: bool = False) -> tuple[PhaseTimer, float, float]:
    """One logged cohort of ``size`` trials, timed by phase; returns (timer, wall, cpu).
    ``trial_plots``: each run's five PNGs at its close (a sweep's ``tracking.trial_plots``)."""
    import workers.cohort.trainer as cohort_trainer
    import workers.train.loop as loop
    from workers.cohort import evaluation as cohort_evaluation
    from workers.cohort.member import own_rng
    from workers.cohort.trainer import Cohort
    from workers.cohort.trial import finish_member_run
    from workers.trial import TrialRunner, default_run_name

    configs = sweep_configs(size, epochs, train_size, device="cpu")
    configs = [c.model_copy(update={"data": c.data.model_copy(update={"val_size": 128, "test_size": 128})})
               for c in configs]
    timer = PhaseTimer()
    created = [False]
    restore = [
        timer.wrap(Cohort, "_train_pass", "train pass"),
        timer.wrap(Cohort, "_sync_trainers", "write-back"),
        timer.wrap(Cohort, "_stack", lambda *a: "restack" if created[0] else "create"),
        timer.wrap(loop.Trainer, "evaluate_split", "eval read-outs"),
        timer.wrap(loop.Trainer, "gradient_readouts", "gradient shares"),  # member by member
        timer.wrap(cohort_trainer, "member_gradient_shares", "gradient shares"),  # batched
        timer.wrap(loop.Trainer, "finalize", "finalize"),
        timer.wrap(TrialRunner, "log_epoch", "logging"),
        timer.wrap(TrialRunner, "settle", "metrics wait"),
        timer.wrap(Cohort, "save_checkpoint", "checkpoints"),
    ]
    forward = "eval forward"
    originals = {"loop": loop.collect}

    def timed_collect(*args, **kwargs):
        with timer.phase(forward):
            return originals["loop"](*args, **kwargs)

    loop.collect = timed_collect
    batched_forward = cohort_evaluation.collect_members

    def timed_members(*args, **kwargs):
        with timer.phase(forward):
            return batched_forward(*args, **kwargs)

    cohort_evaluation.collect_members = timed_members
    uri = f"sqlite:///{cache / 'mlflow.db'}"  # one store: the warm-up pays its schema
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        with timer.phase("create"):
            cohort = Cohort.create(configs, cache)
        created[0] = True
        cohort.batched_eval = batched
        with timer.phase("mlflow start"):
            runs = [TrialRunner.start(m.trainer, uri, "cohort-profile", default_run_name(m.config),
                                   plots=trial_plots, deferred=True) for m in cohort.members]

        while cohort.active:  # Cohort.run's loop in the cohort trainable's order (its epoch, report)
            results = cohort.run_epoch()
            for position, metrics in results.items():
                runs[position].log_epoch(metrics)
            for position in results:
                cohort.save_checkpoint(cohort.members[position],
                                       cache / f"ck-{size}" / f"member_{position}.pt")
            for position in results:  # the trainable settles every run before tune.report
                runs[position].settle()
        for member in cohort.members:  # Cohort.run's end: each lone run's finalize
            if member.status != "failed":
                with own_rng(member):
                    member.trainer.finalize()
        with timer.phase("plots + close"):
            for member, run in zip(cohort.members, runs, strict=True):
                finish_member_run(member, run)
    finally:
        for undo in restore:
            undo()
        loop.collect = originals["loop"]
        cohort_evaluation.collect_members = batched_forward
    return timer, time.perf_counter() - wall, time.process_time() - cpu


def table(size: int, timer: PhaseTimer, wall: float, cpu: float, label: str) -> list[str]:
    """The phases of one profile as lines: seconds, per member, share of the wall."""
    lines = [f"K = {size} ({label}): {wall:.2f} s wall, {cpu:.2f} s CPU, "
             f"{wall / size:.3f} s wall per member",
             f"  {'phase':<16} {'wall s':>8} {'CPU s':>8} {'wall/member':>12} {'share':>7}"]
    rows = [*((name, timer.wall[name], timer.cpu[name]) for name in PHASES),
            ("other", wall - sum(timer.wall.values()), cpu - sum(timer.cpu.values()))]
    for name, seconds, cpu_seconds in rows:
        lines.append(f"  {name:<16} {seconds:>8.2f} {cpu_seconds:>8.2f} {seconds / size:>12.4f} "
                     f"{100 * seconds / wall:>6.1f}%")
    return lines


def main(sizes: tuple[int, ...] = (1, 32, 128), modes: tuple[str, ...] = ("lone", "batched"),
         epochs: int = 2, train_size: int = 256, out: Path | None = None,
         trial_plots: bool = False) -> list[str]:
    torch.set_num_threads(1)
    load = os.getloadavg()
    # Under load when the 1-minute average at the start is above the CPU count.
    loaded = ": figures measured under load" if load[0] > (os.cpu_count() or 1) else ""
    lines = [f"== cohort_profile {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on "
             f"{platform.machine()} ({os.cpu_count()} CPUs, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
             f"at the start{loaded}), torch {torch.__version__}, 1 thread",
             f"   quickstart task, {epochs} epochs, {train_size} train / 128 val / 128 test examples, "
             "batch 64; eval 'lone' = member by member, 'batched' = one forward for all members; "
             f"per-trial PNGs {'on' if trial_plots else 'off (a sweep default)'}"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        # warm-up: imports, MLflow schema
        profile(2, Path(folder), epochs=1, train_size=64, batched=True, trial_plots=trial_plots)
        for size in sizes:
            for mode in modes:
                timer, wall, cpu = profile(size, Path(folder), epochs=epochs, train_size=train_size,
                                           batched=mode == "batched", trial_plots=trial_plots)
                block = table(size, timer, wall, cpu, f"eval {mode}, load {os.getloadavg()[0]:.1f}")
                print("\n".join(block), flush=True)
                lines.extend(block)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        print(f"written to {out}")
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--eval", nargs="+", default=["lone", "batched"], choices=["lone", "batched"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=256)
    parser.add_argument("--trial-plots", action="store_true", help="draw each run's five PNGs")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "docs" / "bench" / f"cohort_profile_cpu_{datetime.date.today()}.txt")
    args = parser.parse_args()
    main(tuple(args.sizes), tuple(args.eval), args.epochs, args.train_size, args.out, args.trial_plots)

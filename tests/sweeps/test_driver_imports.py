"""The sweep's driver waits on Tune and writes the report: it never loads the training stack.
Nor does unpickling the function Tune ships to a trial worker (the worker imports the stack
inside the trial, with the collector off: ``workers.heap``)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _loaded(modules: str, watched: tuple[str, ...]) -> str:
    """Which of ``watched`` a fresh interpreter holds after ``import <modules>``."""
    probe = f"import sys, {modules}; print(sorted(m for m in {watched!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return done.stdout.strip() + done.stderr


def test_the_driver_modules_load_no_torch_sklearn_or_tensorboard():
    loaded = _loaded("service.cli.training, sweeps.tune.runner, sweeps.report.build",
                     ("torch", "sklearn", "tensorboardX", "workers.train.loop"))
    assert loaded == "[]", loaded


def test_the_function_tune_ships_to_workers_unpickles_without_mlflow_or_torch():
    loaded = _loaded("sweeps.tune.trial_entry",
                     ("mlflow", "torch", "sklearn", "sweeps.tune.cohort_trainable"))
    assert loaded == "[]", loaded

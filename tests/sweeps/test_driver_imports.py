"""The sweep's driver waits on Tune and writes the report: it never loads the training stack."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_driver_modules_load_no_torch_sklearn_or_tensorboard():
    probe = ("import sys, service.cli.training, sweeps.tune.runner, sweeps.report.build; "
             "print(sorted(m for m in ('torch', 'sklearn', 'tensorboardX', 'workers.train.loop') "
             "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                            check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_the_function_tune_ships_to_workers_unpickles_without_mlflow_or_torch():
    # a worker then imports them inside the trial, with the collector off (workers.heap)
    probe = ("import sys, sweeps.tune.trial_entry; "
             "print(sorted(m for m in ('mlflow', 'torch', 'sklearn', 'sweeps.tune.cohort_trainable') "
             "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                            check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr

"""The sweep's driver waits on Tune and writes the report: it never loads the training stack.
Nor does unpickling the function Tune ships to a trial worker (the worker imports the stack
inside the trial, with the collector off: ``workers.imports``)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _probe(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in the repository, on a bare environment plus ``env``."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **env})


def _loaded(modules: str, watched: tuple[str, ...]) -> str:
    """Which of ``watched`` a fresh interpreter holds after ``import <modules>``."""
    done = _probe(f"import sys, {modules}; print(sorted(m for m in {watched!r} if m in sys.modules))")
    done.check_returncode()
    return done.stdout.strip() + done.stderr


def test_the_driver_modules_load_no_torch_sklearn_or_tensorboard():
    loaded = _loaded("ksweep.cli.training, sweeps.tune.runner, sweeps.report.build",
                     ("torch", "sklearn", "tensorboardX", "workers.train.loop"))
    assert loaded == "[]", loaded


def test_the_function_tune_ships_to_workers_unpickles_without_mlflow_or_torch():
    loaded = _loaded("sweeps.tune.trial_entry",
                     ("mlflow", "torch", "sklearn", "sweeps.tune.trainable"))
    assert loaded == "[]", loaded


def test_a_discrete_trial_worker_loads_no_sklearn_scipy_stats_or_torch_dynamo():
    """Only the continuous family clusters (scikit-learn's k-means); ranks come from pandas,
    which Ray Tune has loaded anyway: the two would cost each trial worker about 0.8 s. The
    trainers' own AdamW spares it ``torch._dynamo`` (workers/adamw.py)."""
    probe = (
        "import sys, tempfile\n"
        "from sweeps.tune.trial_entry import load_training_stack\n"
        "load_training_stack()\n"
        "from sweeps.spec import load_sweep_spec\n"
        "from workers.train import Trainer\n"
        "spec = load_sweep_spec('sweeps/examples/quickstart.yaml')\n"
        "trainer = Trainer.create(spec.trial_config(1.0, 'uniform', 'discrete', 0), tempfile.mkdtemp())\n"
        "metrics = trainer.run_epoch()\n"
        "assert metrics['train/kl_kappa_spearman'] == metrics['train/kl_kappa_spearman'], metrics\n"
        "print(sorted(m for m in ('sklearn', 'scipy.stats', 'torch._dynamo') if m in sys.modules))\n"
    )
    done = _probe(probe, OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr[-2000:]


def test_a_database_tracking_uri_loads_mlflows_store_with_the_stack_without_connecting(tmp_path):
    """The SQLAlchemy store's module and mappers are imported with the collector off; a server
    URI does not pay for them, and nothing connects (an unreachable store is for the retries)."""
    database = tmp_path / "absent" / "mlflow.db"
    store = "mlflow.store.tracking.sqlalchemy_store"
    for uri, expected in ((f"sqlite:///{database}", True), ("postgresql://nobody@127.0.0.1:9/x", True),
                          ("http://127.0.0.1:9", False)):
        done = _probe("import sys\n"
                      "from sweeps.tune.trial_entry import load_training_stack\n"
                      f"load_training_stack({uri!r})\n"
                      f"print({store!r} in sys.modules)\n")
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == str(expected), (uri, done.stdout)
    assert not database.parent.exists()

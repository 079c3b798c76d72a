"""The bare variant of ``bench_sweep``: the Tune function a hand-written script would run.

Its own module, importing only what such a script imports (Ray Tune, the spec, the trainer),
because Ray pickles a module-level function by reference: the trial process imports the
module that defines it, and ``benchmarks.bench_sweep`` imports the whole sweep driver (MLflow,
matplotlib, SQLAlchemy). Defined there, the bare trials paid ksweep's imports too.
"""

from __future__ import annotations

from typing import Any

from ray import tune

from sweeps.spec import SweepSpec
from workers.train import Trainer


def bare_trial(params: dict[str, Any], *, spec: SweepSpec, cache_root: str) -> None:
    """Train and report every epoch, nothing else (no checkpoint, no MLflow, no plots)."""
    config = spec.trial_config(
        float(params["alpha"]), str(params["loss_stack"]), str(params["model"]), int(params["seed"])
    )
    trainer = Trainer.create(config, cache_root)
    while trainer.epoch < config.training.epochs:
        tune.report(trainer.run_epoch())

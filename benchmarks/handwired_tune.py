"""The script a researcher wires by hand for a sweep: the headline benchmark's baseline.

A Ray Tune function trainable that trains each grid point with the project's trainer
(``workers.train.Trainer``) and reports every epoch, one trial per actor (Tune's default, no
actor reuse), logged to MLflow through Ray's ``MLflowLoggerCallback``. The grid is every row
of the spec (alpha x stack x model x seed: nothing deduplicated), trial configs come from the
spec as ``ksweep`` builds them, the epochs are the spec's. No checkpoints, no report.

    python -m benchmarks.handwired_tune SPEC.yaml --num-cpus 2 --storage DIR

MLflow goes to ``MLFLOW_TRACKING_URI`` (as for ``ksweep``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.air.integrations.mlflow import MLflowLoggerCallback

from sweeps.spec import SweepSpec, load_sweep_spec
from workers.train import Trainer


def train(config: dict[str, Any], *, spec: SweepSpec, cache_root: str) -> None:
    trainer = Trainer.create(
        spec.trial_config(config["alpha"], config["loss_stack"], config["model"], config["seed"]),
        cache_root,
    )
    while trainer.epoch < spec.template.training.epochs:
        tune.report(trainer.run_epoch())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--storage", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = load_sweep_spec(args.spec)
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    trainable = tune.with_resources(
        tune.with_parameters(train, spec=spec, cache_root=str(args.storage / "cache")),
        {"cpu": spec.resources.cpu},
    )
    tuner = tune.Tuner(
        trainable,
        param_space={
            "alpha": tune.grid_search([float(a) for a in spec.alpha_values()]),
            "loss_stack": tune.grid_search(spec.stack_labels()),
            "model": tune.grid_search(list(spec.models)),
            "seed": tune.grid_search(spec.seed_list()),
        },
        tune_config=tune.TuneConfig(max_concurrent_trials=spec.budget.max_concurrent_trials),
        run_config=tune.RunConfig(
            name="handwired", storage_path=str(args.storage.resolve()), verbose=0,
            callbacks=[MLflowLoggerCallback(tracking_uri=os.environ["MLFLOW_TRACKING_URI"],
                                            experiment_name=spec.name, save_artifact=False)],
        ),
    )
    results = tuner.fit()
    print(f"handwired: {len(results)} trials, {len(results.errors)} errors")
    return 1 if results.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())

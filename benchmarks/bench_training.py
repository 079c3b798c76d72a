"""Training throughput of the `uniform` stack against `raw_plus_ncc` + `kl`, and peak RSS.

Both trainers train the same model on the same data, one epoch each in turn, so
machine drift hits both alike. Goal: raw_plus_ncc + kl at most 1.10x the time
per token of uniform. Peak RSS of one example trial process: goal <= 1.5 GiB.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from objectives import LossStackSpec
from workers.train import Trainer, load_trial_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "workers" / "examples" / "discrete.yaml"


def _trainer(stack: LossStackSpec, cache: str) -> Trainer:
    config = load_trial_config(EXAMPLE)
    config = config.model_copy(update={
        "loss_stack": stack,
        "data": config.data.model_copy(update={"train_size": 2048}),
        "training": config.training.model_copy(update={"epochs": 1000, "device": "cpu"}),
    })
    return Trainer.create(config, cache)


def throughput(repeats: int = 5) -> None:
    with tempfile.TemporaryDirectory() as cache:
        uniform = _trainer(LossStackSpec(preset="uniform", alpha=1.0), cache)
        full = _trainer(
            LossStackSpec(preset="raw_plus_ncc", alpha=1.0,
                          terms={"kl": {"weight": 1.0, "options": {"free_bits": 0.3}}}),
            cache,
        )
        rates: dict[str, list[float]] = {"uniform": [], "raw_plus_ncc + kl": []}
        for trainer in (uniform, full):  # warm-up epoch
            trainer.train_epoch()
        for _ in range(repeats):
            for name, trainer in (("uniform", uniform), ("raw_plus_ncc + kl", full)):
                rates[name].append(trainer.train_epoch()["perf/tokens_per_second"])
    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratio = medians["uniform"] / medians["raw_plus_ncc + kl"]
    print("\n== training throughput, one epoch of 2048 examples (discrete example model, CPU)")
    for name, rate in medians.items():
        print(f"  {name:<24s} {rate:12,.0f} active tokens/s")
    verdict = "met" if ratio <= 1.10 else "NOT met"
    print(f"  time per token, raw_plus_ncc + kl / uniform: {ratio:.3f}x  (goal <= 1.10x: {verdict})")


def peak_rss() -> None:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlflow.db",
               "KSWEEP_SWEEP_ROOT": folder}
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "ksweep.cli", "train", str(EXAMPLE), "--experiment", "bench"],
            env=env, cwd=folder, check=True, capture_output=True,
        )
        elapsed = time.perf_counter() - started
    kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    gib = kib / 2**20
    verdict = "met" if gib <= 1.5 else "NOT met"
    print("\n== one example trial process (ksweep train workers/examples/discrete.yaml)")
    print(f"  peak RSS {gib:.3f} GiB (goal <= 1.5 GiB: {verdict}); wall {elapsed:.1f} s incl. MLflow")


def main() -> None:
    throughput()
    peak_rss()


if __name__ == "__main__":
    main()

"""Train the example discrete trial on CUDA with bf16 autocast; print tokens/s and peak memory.

For GPU machines: ``python -m benchmarks.gpu_trial``. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from workers.train import Trainer, load_trial_config

EXAMPLE = Path(__file__).resolve().parents[1] / "workers" / "examples" / "discrete.yaml"


def main(epochs: int = 5, train_size: int = 65_536, batch_size: int = 1024) -> int:
    if not torch.cuda.is_available():
        print("gpu_trial: CUDA is not available; skipping (run this on a GPU machine)")
        return 0
    config = load_trial_config(EXAMPLE)
    rows = []
    for bf16 in (False, True):
        trial = config.model_copy(update={
            "data": config.data.model_copy(update={"train_size": train_size, "val_size": 4096}),
            "training": config.training.model_copy(update={
                "device": "cuda", "bf16": bf16, "epochs": epochs, "batch_size": batch_size,
                "eval_batch_size": 4096,
            }),
        })
        with tempfile.TemporaryDirectory() as cache:
            trainer = Trainer.create(trial, cache)
            trainer.train_epoch()  # warm-up: CUDA context, kernels, allocator
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            rates = []
            for _ in range(epochs):
                started = time.perf_counter()
                metrics = trainer.train_epoch()
                torch.cuda.synchronize()
                rates.append(int(trainer.train_data.split.mask.sum()) / (time.perf_counter() - started))
            evaluation = trainer.evaluate()
        peak = torch.cuda.max_memory_allocated() / 2**20
        rows.append((bf16, max(rates), peak, metrics["train/loss"], evaluation["val/latent_nmi"]))
    print(f"gpu_trial on {torch.cuda.get_device_name()} (torch {torch.__version__}), "
          f"{train_size} examples, batch {batch_size}")
    for bf16, rate, peak, loss, nmi in rows:
        print(f"  bf16={bf16!s:<5} {rate:14,.0f} active tokens/s  peak {peak:8.1f} MiB  "
              f"train/loss {loss:.4f}  val/latent_nmi {nmi:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

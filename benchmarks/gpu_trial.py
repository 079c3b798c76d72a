"""Trials per GPU-hour: cohorts of K trials in W worker processes sharing one GPU.

For GPU machines: ``python -m benchmarks.gpu_trial`` (about 8 minutes at most). It needs
torch and the project's pure-Python dependencies (pydantic, numpy, pyyaml, scikit-learn),
no Ray and no MLflow: every worker is a plain ``python -m benchmarks.gpu_trial --worker``
process that trains one cohort (workers/cohort/trainer.py) with bf16 autocast and prints
one JSON line. For each W in 1, 2, 4 and K in 1, 8, 32, 128 the W workers start together;
trials/GPU-hour = W x K / wall, counted two ways: from the workers' first to last training
second (steady) and from the launch to the last exit (with process start, CUDA init and
trial creation). Configurations left when the time budget runs out are listed as skipped.
Without CUDA it says so and exits 0; ``--cpu-smoke`` runs a tiny version on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU = {"sizes": (1, 8, 32, 128), "workers": (1, 2, 4), "epochs": 2, "train_size": 4096,
       "batch_size": 256, "device": "cuda", "budget_s": 420.0}
SMOKE = {"sizes": (2,), "workers": (2,), "epochs": 1, "train_size": 64,
         "batch_size": 32, "device": "cpu", "budget_s": 300.0}


def worker(size: int, epochs: int, train_size: int, batch_size: int, device: str) -> None:
    """Train one cohort of ``size`` sweep trials; print ``{"trials", "start", "end", ...}``."""
    import tempfile

    import torch

    from benchmarks.bench_cohort import sweep_configs
    from workers.cohort.trainer import run_cohort

    torch.set_num_threads(1)
    configs = sweep_configs(size, epochs, train_size, batch_size=batch_size, device=device,
                            bf16=device == "cuda", eval_batch_size=4096)
    configs = [c.model_copy(update={"data": c.data.model_copy(update={"val_size": 512})}) for c in configs]
    with tempfile.TemporaryDirectory() as cache:
        start = time.time()
        members = run_cohort(configs, cache)
        if device == "cuda":
            torch.cuda.synchronize()
        end = time.time()
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0.0
    print(json.dumps({"trials": size, "start": start, "end": end, "peak_mib": peak,
                      "finished": sum(m.status == "finished" for m in members)}))


def measure(size: int, workers: int, settings: dict) -> dict:
    """Launch ``workers`` cohort processes at once and collect their lines."""
    command = [sys.executable, "-m", "benchmarks.gpu_trial", "--worker", "--size", str(size),
               "--epochs", str(settings["epochs"]), "--train-size", str(settings["train_size"]),
               "--batch-size", str(settings["batch_size"]), "--device", settings["device"]]
    launched = time.time()
    processes = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                      filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
                 for _ in range(workers)]
    lines = []
    for process in processes:
        out, err = process.communicate(timeout=settings["budget_s"])
        if process.returncode != 0:
            raise RuntimeError(f"gpu_trial worker failed (K={size}):\n{err[-3000:]}")
        lines.append(json.loads(out.strip().splitlines()[-1]))
    exited = time.time()
    trials = sum(line["trials"] for line in lines)
    steady = max(line["end"] for line in lines) - min(line["start"] for line in lines)
    return {"trials": trials, "steady": 3600 * trials / steady, "launch": 3600 * trials / (exited - launched),
            "peak_mib": max(line["peak_mib"] for line in lines),
            "finished": sum(line["finished"] for line in lines)}


def main(cpu_smoke: bool = False) -> int:
    import torch

    if not cpu_smoke and not torch.cuda.is_available():
        print("gpu_trial: CUDA is not available; skipping (run this on a GPU machine, or --cpu-smoke)")
        return 0
    settings = SMOKE if cpu_smoke else GPU
    unit = "trials/hour (CPU smoke)" if cpu_smoke else "trials/GPU-hour"
    where = "CPU" if cpu_smoke else torch.cuda.get_device_name()
    print(f"\n== gpu_trial on {where} (torch {torch.__version__}): cohorts of the sweep's trials, "
          f"{settings['epochs']} epochs, {settings['train_size']} train examples, batch "
          f"{settings['batch_size']}, bf16 autocast {'off (CPU)' if cpu_smoke else 'on'}")
    print(f"  {'workers':>7} {'K':>4} {unit + ' (steady)':>34} {'(incl. start)':>14} {'peak MiB':>9}")
    started, base = time.time(), None
    for workers in settings["workers"]:
        for size in settings["sizes"]:
            if time.time() - started > settings["budget_s"]:
                print(f"  {workers:>7} {size:>4} skipped: the {settings['budget_s']:.0f} s budget is spent")
                continue
            row = measure(size, workers, settings)
            base = base or row["steady"]
            print(f"  {workers:>7} {size:>4} {row['steady']:>34,.0f} {row['launch']:>14,.0f} "
                  f"{row['peak_mib']:>9.0f}   {row['steady'] / base:5.1f}x  "
                  f"({row['finished']}/{row['trials']} finished)")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny run on the CPU (for tests)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--train-size", type=int, default=4096, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.size, args.epochs, args.train_size, args.batch_size, args.device)
        sys.exit(0)
    sys.exit(main(args.cpu_smoke))

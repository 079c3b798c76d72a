"""Cohort scaling on CPU: K trials as one cohort against the same K trials trained one by one.

The trials are the headline sweep's: the quickstart task, alpha {0, 0.5, 1, 2} x four loss
stacks (uniform, raw_plus_ncc, ncc, raw_token_weighted, each with the quickstart's KL term)
x seeds {0, 1}; a cohort of K takes the first K of those 32 (K = 32 is the whole sweep).
Each trial is a whole trial (create: data, oracle b_t, model; train; the lone evaluation
every epoch) with the same fixed epochs. The lone baseline trains the first trials with the
existing Trainer, one after another; K sequential lone trials cost K x its median trial time.
Cohorts and lone trials alternate in one process (torch on 1 thread), so drift hits both
alike. Printed per K: trials per hour, wall and CPU seconds per trial, and the speed-up over
K sequential lone trials, by wall time and by process CPU time (steadier on a shared machine).

The floor: a lone trial's training passes alone (its steps' forward, objective, backward and
AdamW update, with the fused ``nn.GRU`` kernel), no creation, evaluation or read-outs. Every
trial does at least that work; each K is also printed as its cost per trial over the floor
(the issue's goal: within 1.5x at K = 32). Floor runs alternate with the rest too.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from objectives import LossStackSpec
from workers.cohort.chunked import run_cohort
from workers.train import Trainer, TrialConfig

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
STACKS = ("uniform", "raw_plus_ncc", "ncc", "raw_token_weighted")
ALPHAS = (0.0, 0.5, 1.0, 2.0)
SEEDS = (0, 1)


def sweep_configs(count: int, epochs: int, train_size: int | None = None, **training) -> list[TrialConfig]:
    """The first ``count`` trials of stacks x alphas x seeds (cycling past 32) on the quickstart task."""
    spec = yaml.safe_load(QUICKSTART.read_text())
    template, kl = spec["template"], spec["common_terms"]["kl"]
    data = dict(template["data"], **({"train_size": train_size} if train_size else {}))
    points = [(s, a, seed) for s in STACKS for a in ALPHAS for seed in SEEDS]
    configs = []
    for index in range(count):
        stack, alpha, seed = points[index % len(points)]
        configs.append(TrialConfig.model_validate({
            "name": f"discrete-{stack}-a{alpha:g}-s{seed}-{index}", "seed": seed + 2 * (index // 32),
            "data": data, "base": template["base"], "model": {"family": "discrete"},
            "loss_stack": LossStackSpec(preset=stack, alpha=alpha, terms={"kl": kl}),
            "training": {**template["training"], "epochs": epochs, **training},
        }))
    return configs


def _timed(run: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def training_floor(config: TrialConfig, cache: str | Path) -> tuple[float, float, int]:
    """Wall and CPU seconds of one lone trial's training passes only, and the steps it took."""
    trainer = Trainer.create(config, cache)
    wall = cpu = 0.0
    for _ in range(config.training.epochs):
        epoch_wall, epoch_cpu = _timed(trainer.train_epoch)
        wall, cpu = wall + epoch_wall, cpu + epoch_cpu
    return wall, cpu, trainer.step


def main(sizes: tuple[int, ...] = (1, 4, 16, 32), epochs: int = 2, lone_trials: int = 4,
         train_size: int | None = None) -> None:
    torch.set_num_threads(1)
    configs = sweep_configs(max(sizes), epochs, train_size, device="cpu")
    with tempfile.TemporaryDirectory() as cache:
        run_cohort(configs[:2], cache)  # warm-up: imports, allocator
        Trainer.create(configs[0], cache).run()
        lone: list[tuple[float, float]] = []
        floor: list[tuple[float, float, int]] = []
        cohorts: dict[int, tuple[float, float]] = {}
        for index, size in enumerate(sizes):  # alternate: lone trial, floor, cohort, lone trial, ...
            lone.append(_timed(lambda i=index: Trainer.create(configs[i % len(configs)], cache).run()))
            floor.append(training_floor(configs[index % len(configs)], cache))
            cohorts[size] = _timed(lambda n=size: run_cohort(configs[:n], cache))
        for index in range(len(sizes), lone_trials):
            lone.append(_timed(lambda i=index: Trainer.create(configs[i], cache).run()))
            floor.append(training_floor(configs[index], cache))
    lone_wall = statistics.median(w for w, _ in lone)
    lone_cpu = statistics.median(c for _, c in lone)
    floor_wall = statistics.median(w for w, _, _ in floor)
    floor_cpu = statistics.median(c for _, c, _ in floor)
    print(f"\n== cohorts on CPU (1 torch thread): quickstart task, {epochs} epochs per trial, "
          f"{configs[0].data.train_size} train examples, batch {configs[0].training.batch_size}")
    print(f"  lone trial (median of {len(lone)}): {lone_wall:.2f} s wall, {lone_cpu:.2f} s CPU, "
          f"{3600 / lone_wall:,.0f} trials/hour")
    print(f"  the floor, a lone trial's {floor[0][2]} training steps alone (median of {len(floor)}): "
          f"{floor_wall:.3f} s wall, {floor_cpu:.3f} s CPU")
    print(f"  {'K':>3} {'trials/hour':>12} {'wall s/trial':>13} {'CPU s/trial':>12} "
          f"{'speed-up (wall)':>16} {'speed-up (CPU)':>15} {'x floor (wall)':>15} {'x floor (CPU)':>14}")
    for size, (wall, cpu) in cohorts.items():
        print(f"  {size:>3} {3600 * size / wall:>12,.0f} {wall / size:>13.3f} {cpu / size:>12.3f} "
              f"{lone_wall * size / wall:>15.2f}x {lone_cpu * size / cpu:>14.2f}x "
              f"{wall / size / floor_wall:>14.2f}x {cpu / size / floor_cpu:>13.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=None, help="train examples (default: the quickstart's)")
    parser.add_argument("--lone-trials", type=int, default=4, help="lone trials and floor runs, at least one per size")
    args = parser.parse_args()
    main(tuple(args.sizes), args.epochs, args.lone_trials, args.train_size)

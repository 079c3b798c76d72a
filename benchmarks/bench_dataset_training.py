"""Training on a registered dataset of 1,000,000 rows: time to the first batch, and how long
a training epoch waits for batches against its compute.

Steps: write a 1,000,000-row table (y 4..16 ids, x 0..8 ids, 2,000 distinct ids spread up to 1,000,000,
4 labels, 2 groups), register it (``canonicalize`` + ``DatasetStore.add``), then

- **first batch**: from the resolved config to the first training batch: memory-map the
  trainer arrays cached under the cache root and index the first batch. Goal: under 1 s.
  Also the cold figure: the first trial of a (dataset, split, length) on a worker reads the
  stored Parquet and builds the arrays (split, compaction, padding) before caching them.
- **wait vs compute**: ``--steps`` optimisation steps of a real :class:`Trainer` (precomputed
  base, the default CVAE, batch 64), timing apart the batch gather (indexing the in-memory
  split tensors, what the loop waits for) and the forward/backward/step. Goal: wait under 5%
  of compute. Every step of an epoch gathers the same way, so the ratio over these steps is
  the epoch's.

    python -m benchmarks.bench_dataset_training [--rows 1000000] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from workers.data.config import DatasetDataConfig
from workers.datasets.resolve import resolve_dataset
from workers.datasets.source import load_task
from workers.datasets.store import DatasetStore
from workers.datasets.table import canonicalize


def big_table(rows: int, seed: int = 0) -> pa.Table:
    """A synthetic stand-in for a researcher's table (module doc), built vectorised."""
    rng = np.random.default_rng(seed)
    y_len = rng.integers(4, 17, size=rows)
    x_len = rng.integers(0, 9, size=rows)
    ids = lambda n: rng.integers(0, 2_000, size=n, dtype=np.int64) * 499  # noqa: E731
    y_off = np.concatenate([[0], np.cumsum(y_len)]).astype(np.int32)
    x_off = np.concatenate([[0], np.cumsum(x_len)]).astype(np.int32)
    nll = rng.uniform(0.1, 6.0, size=int(y_off[-1])).astype(np.float32)
    return pa.table({
        "y": pa.ListArray.from_arrays(y_off, ids(int(y_off[-1]))),
        "x": pa.ListArray.from_arrays(x_off, ids(int(x_off[-1]))),
        "label": pa.array(rng.integers(0, 4, size=rows)),
        "group": pa.array(np.where(y_len < 10, "short", "long")),
        "base_nll": pa.ListArray.from_arrays(y_off, nll),
    })


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description="dataset training benchmark")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from workers.train import Trainer, TrialConfig

    with tempfile.TemporaryDirectory(prefix="ksweep-bench-ds-") as folder:
        root = Path(folder)
        table = big_table(args.rows)
        started = time.perf_counter()
        DatasetStore(root / "datasets").add(canonicalize(table, "big.parquet"), name="big",
                                            owner="bench")
        register_s = time.perf_counter() - started
        data = resolve_dataset(DatasetDataConfig(dataset="big"), root / "datasets")
        timings = []
        for _ in range(2):  # cold: builds the arrays and caches them; warm: memory-maps them
            started, cpu = time.perf_counter(), time.process_time()
            task = load_task(data, root)
            train = task.splits["train"]
            first = torch.randperm(len(train))[:64]
            batch = (train.context[first], train.target[first], train.mask[first])
            timings.append((time.perf_counter() - started, time.process_time() - cpu))
        (cold_s, cold_cpu_s), (first_batch_s, first_batch_cpu_s) = timings
        assert batch[0].shape[0] == 64
        config = TrialConfig.model_validate({
            "data": data.model_dump(), "base": {"kind": "precomputed"},
            "training": {"epochs": 1, "batch_size": 64}})
        trainer = Trainer.create(config, root)
        stack, _ = trainer.loss_stacks()
        split = trainer.train_data
        order = torch.randperm(len(split.split), generator=torch.Generator().manual_seed(0))
        wait = compute = 0.0
        trainer.model.train()
        from objectives import LossInputs

        for step, indices in enumerate(order.split(64)):
            if step == args.steps:
                break
            t0 = time.perf_counter()
            gathered = (split.split.context[indices], split.decoder_input[indices],
                        split.split.target[indices], split.split.mask[indices],
                        split.base_nll[indices])
            t1 = time.perf_counter()
            output = trainer.model(*gathered[:4])
            loss = stack(LossInputs(output.token_nll, gathered[4], gathered[3], kl=output.kl,
                                    bow_logits=output.bow_logits, targets=gathered[2],
                                    step=step)).total
            trainer.optimizer.zero_grad()
            loss.backward()
            trainer.optimizer.step()
            t2 = time.perf_counter()
            wait, compute = wait + (t1 - t0), compute + (t2 - t1)
    figures = {
        "rows": args.rows, "register_s": register_s, "cold_first_batch_s": cold_s, "cold_first_batch_cpu_s": cold_cpu_s,
        "first_batch_s": first_batch_s,
        "first_batch_cpu_s": first_batch_cpu_s,
        "vocab_size": task.vocab_size, "max_target_length": task.max_target_length,
        "steps": args.steps, "wait_s": wait, "compute_s": compute,
        "wait_share": wait / compute, "load1": os.getloadavg()[0],
    }
    print(f"dataset training: {args.rows:,} rows registered in {register_s:.1f} s; first batch "
          f"{first_batch_s:.3f} s wall, {first_batch_cpu_s:.3f} s CPU (goal < 1 s) from the cached "
          f"arrays; the first trial on a worker builds them: {cold_s:.2f} s wall, "
          f"{cold_cpu_s:.2f} s CPU; vocabulary compacted to {task.vocab_size} ids, "
          f"T = {task.max_target_length}")
    print(f"  {args.steps} steps: waiting for batches {wait:.3f} s vs compute {compute:.1f} s = "
          f"{100 * wait / compute:.2f}% (goal < 5%); load average {os.getloadavg()[0]:.1f}")
    return figures


if __name__ == "__main__":
    main()

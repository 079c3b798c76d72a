"""Trials per GPU-hour and the fraction of the GPU's peak: cohorts of K trials in W worker processes.

For GPU machines: ``python -m benchmarks.gpu_trial`` (at most about 5 minutes). It needs torch
and the project's pure-Python dependencies (pydantic, numpy, pyyaml, scikit-learn), no Ray and
no MLflow: every worker is a plain ``python -m benchmarks.gpu_trial --worker`` process that
trains one cohort (workers/cohort/trainer.py, bf16 autocast) for a fixed number of steps
(``epochs`` x train_size / batch_size, every batch full so every step has one shape) and
prints one JSON line. Grid: mode {eager, compiled} x K {128, 1024} x W {1, 4}, the W workers
starting together; configurations left when the budget runs out are listed as skipped.

- ``eager``: the cohort as it is. ``compiled``: the library's compiled step
  (workers/cohort/compiled.py, ``training.compile: on``): forward and loss stacks in one
  graph (backward through AOTAutograd), clipping and the stacked AdamW in another, static
  shapes. Backend inductor; where ``import triton`` fails, dynamo's ``cudagraphs`` backend
  (``torch.cuda.graphs`` capture of the AOT graphs, no triton). Where compilation still
  cannot run the worker trains eagerly and the row prints the reason. Compile time: the
  first training pass less the steady pass, and the step's own warm-up seconds, printed
  apart (both are inside every end-to-end figure).
- A cohort that does not fit the GPU's free memory trains in memory-sized chunks
  (workers/cohort/memory.py); the row prints the chunk count.
- trials/GPU-hour = W x K / wall, from the workers' first to last training second (steady)
  and from the launch to the last exit (with process start, CUDA init and trial creation).
- FLOPs (``torch.utils.flop_counter.FlopCounterMode``: 2mnk per matmul, counted on one
  training forward of all K members): a training step is 3x its forward (forward plus
  backward); the epoch-end evaluation forwards (train subset, val, test) are counted apart.
  Achieved = training FLOPs of all workers / the slowest worker's summed training-pass
  seconds; fraction of peak = achieved / 989 TFLOP/s (the H200's dense bf16 peak).
- compiled-vs-eager check (worker 0 of each compiled row): the step's loss graph run
  compiled and eagerly on the same batch under bf16 autocast; every member's loss must agree
  within rtol 2e-2, atol 2e-2 (bf16 keeps 8 bits of mantissa: ~0.4% per rounding, accumulated).

Without CUDA it says so and exits 0; ``--cpu-smoke`` runs a tiny grid on the CPU with the
``aot_eager`` backend (no C++ or triton compile) and float32.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEAK_FLOPS = 989e12  # H200 SXM dense bf16 (no sparsity)
GPU = {"sizes": (128, 1024), "workers": (1, 4), "modes": ("eager", "compiled"), "epochs": 2,
       "train_size": 4096, "batch_size": 256, "device": "cuda", "backend": "inductor", "budget_s": 300.0}
SMOKE = {"sizes": (2,), "workers": (1,), "modes": ("eager", "compiled"), "epochs": 1,
         "train_size": 64, "batch_size": 32, "device": "cpu", "backend": "aot_eager", "budget_s": 900.0}


def compile_backend(device: str, backend: str) -> str:
    """``backend``, or ``cudagraphs`` (CUDA graph capture, no triton) where inductor has no triton."""
    if backend == "inductor" and device == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "cudagraphs"
    return backend


def count_flops(cohort) -> dict[str, float]:
    """Forward FLOPs (2mnk per matmul) of one full training batch and of one epoch end, all members."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from workers.models.functional import cvae_forward
    from workers.readouts.split_data import readout_split

    data, training = cohort._data, cohort.members[0].config.training
    rows = torch.arange(training.batch_size, device=cohort.device)
    batch = {key: value[cohort._source.unsqueeze(1), rows] for key, value in data.items()}
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        cvae_forward(cohort.params, cohort.model_config, cohort.num_categories, batch["context"],
                     batch["decoder_input"], batch["target"], batch["mask"], None, 1.0)
    step = counter.get_total_flops()
    readouts = cohort.members[0].config.readouts
    names = ("train", "val", "test") if readouts.test else ("train", "val")
    eval_rows = sum(len(readout_split(cohort.members[0].trainer.splits[n], n, readouts.train_subset).split)
                    for n in names)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        cvae_forward(cohort.params, cohort.model_config, cohort.num_categories, batch["context"],
                     batch["decoder_input"], batch["target"], batch["mask"], training=False)
    return {"forward_per_step": float(step), "train_per_step": 3.0 * step,
            "eval_per_epoch": counter.get_total_flops() * eval_rows / training.batch_size}


def compiled_check(cohort) -> dict[str, float | bool]:
    """The compiled step's loss graph against the same function run eagerly, on one full batch."""
    import contextlib

    import torch

    step = cohort._compiled
    rows = torch.arange(cohort.members[0].config.training.batch_size, device=cohort.device)
    batch = {key: value[cohort._source.unsqueeze(1), rows] for key, value in cohort._data.items()}
    dtype = torch.float32
    alive = tuple(m.status == "running" for m in step.rows)
    args = (cohort.params, batch["context"], batch["decoder_input"], batch["target"], batch["mask"],
            batch["base_nll"], step._draws(alive, len(rows), len(rows)), torch.tensor(1.0, device=cohort.device),
            step._step_weights(cohort.step, dtype), torch.ones(len(step.rows), device=cohort.device),
            torch.tensor(alive, device=cohort.device))
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if cohort.device.type == "cuda"
                else contextlib.nullcontext())
    with autocast:
        eager = torch.cat([group[0] for group in step._loss_fn(*args)[1]]).float()
        compiled = torch.cat([group[0] for group in step._loss(*args)[1]]).float()
    difference = (compiled - eager).abs()
    return {"max_abs": float(difference.max()), "max_rel": float((difference / eager.abs().clamp_min(1e-6)).max()),
            "passed": bool(torch.allclose(compiled, eager, rtol=2e-2, atol=2e-2))}


def worker(size: int, settings: dict, mode: str, first: bool) -> None:
    """Train one cohort of ``size`` sweep trials; print one JSON line (times, FLOPs, checks)."""
    import tempfile

    import torch

    from benchmarks.bench_cohort import sweep_configs
    from workers.cohort.compiled import CompiledStep, use_inductor_cache
    from workers.cohort.memory import plan_chunks
    from workers.cohort.trainer import Cohort

    torch.set_num_threads(1)
    device = settings["device"]
    configs = sweep_configs(size, settings["epochs"], settings["train_size"], batch_size=settings["batch_size"],
                            device=device, bf16=device == "cuda", eval_batch_size=4096,
                            compile="on" if mode == "compiled" else "off")
    configs = [c.model_copy(update={"data": c.data.model_copy(update={"val_size": 512, "test_size": 512})})
               for c in configs]
    line: dict = {"trials": size, "mode": mode, "fallback": None, "warm_up_s": 0.0}
    CompiledStep.backend = line["backend"] = compile_backend(device, settings["backend"])
    passes: list[float] = []
    finished = steps = 0
    with tempfile.TemporaryDirectory() as cache:
        use_inductor_cache(cache)
        start = time.time()
        members = Cohort.create_members(configs, cache)
        line["created"] = time.time()
        chunks = plan_chunks([m.trainer for m in members])
        line["chunks"] = len(chunks)
        for number, chunk in enumerate(chunks):
            cohort = Cohort.from_members([members[i] for i in chunk], cache)
            if first and number == 0:
                probed = time.time()
                line["flops"] = count_flops(cohort)
                if cohort._compiled is not None:
                    line["check"] = compiled_check(cohort)
                line["probe_s"] = time.time() - probed
            train_pass = cohort._train_pass

            def timed(active, train_pass=train_pass):
                began = time.perf_counter()
                result = train_pass(active)
                if device == "cuda":
                    torch.cuda.synchronize()
                passes.append(time.perf_counter() - began)
                return result

            cohort._train_pass = timed
            finished += sum(m.status == "finished" for m in cohort.run())
            steps += cohort.step
            line["fallback"] = line["fallback"] or cohort.compile_fallback
            if cohort._compiled is not None:
                line["warm_up_s"] += cohort._compiled.compile_seconds
        if device == "cuda":
            torch.cuda.synchronize()
        end = time.time()
    if mode == "compiled" and line["fallback"] is None:
        from torch._dynamo.utils import counters

        line["graphs"] = int(counters["stats"]["unique_graphs"])
    steady = statistics.median(passes[1:]) if len(passes) > 1 else passes[0]
    line.update(start=start, end=end, passes=passes, steps=steps, compile_s=passes[0] - steady,
                peak_mib=torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0.0,
                finished=finished)
    print(json.dumps(line))


def measure(size: int, workers: int, mode: str, settings: dict, timeout: float) -> dict:
    """Launch ``workers`` cohort processes at once and collect their lines."""
    command = [sys.executable, "-m", "benchmarks.gpu_trial", "--worker", json.dumps(settings),
               "--size", str(size), "--mode", mode]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    launched = time.time()
    processes = [subprocess.Popen([*command, *(["--first"] if index == 0 else [])], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for index in range(workers)]
    lines = []
    for process in processes:
        out, err = process.communicate(timeout=timeout)
        if process.returncode != 0:
            raise RuntimeError(f"gpu_trial worker failed (K={size}, {mode}):\n{err[-3000:]}")
        lines.append(json.loads(out.strip().splitlines()[-1]))
    exited = time.time()
    trials = sum(line["trials"] for line in lines)
    # The first worker's FLOP count and compiled check are measurements: its end without them.
    steady = max(line["end"] - line.get("probe_s", 0.0) for line in lines) - min(line["start"] for line in lines)
    # Training seconds without the compile: the first pass's excess, or the warm-up steps when larger.
    train_s = max(sum(line["passes"]) - max(line["compile_s"], line["warm_up_s"], 0.0) for line in lines)
    flops = lines[0]["flops"]
    achieved = flops["train_per_step"] * lines[0]["steps"] * workers / train_s
    return {"trials": trials, "steady": 3600 * trials / steady, "launch": 3600 * trials / (exited - launched),
            "peak_mib": max(line["peak_mib"] for line in lines), "achieved": achieved, "flops": flops,
            "compile_s": max(line["compile_s"] for line in lines), "fallback": lines[0]["fallback"],
            "graphs": lines[0].get("graphs"), "check": lines[0].get("check"),
            "chunks": lines[0]["chunks"], "backend": lines[0]["backend"],
            "warm_up_s": max(line["warm_up_s"] for line in lines),
            "finished": sum(line["finished"] for line in lines), "parts": time_parts(lines)}


def time_parts(lines: list[dict]) -> dict[str, float]:
    """Where a worker's time went, the mean over the workers: creating the members (data, b_t,
    models), the training passes (a compile included), and the rest (epoch ends: evaluation,
    read-outs, gradient shares; stacking the chunks). The first worker's FLOP count and
    compiled-vs-eager check are measurements, not training: left out."""
    create = statistics.fmean(line["created"] - line["start"] for line in lines)
    train = statistics.fmean(sum(line["passes"]) for line in lines)
    total = statistics.fmean(line["end"] - line["start"] - line.get("probe_s", 0.0) for line in lines)
    return {"create": create, "train": train, "rest": total - create - train, "total": total}


def main(cpu_smoke: bool = False) -> int:
    import torch

    if not cpu_smoke and not torch.cuda.is_available():
        print("gpu_trial: CUDA is not available; skipping (run this on a GPU machine, or --cpu-smoke)")
        return 0
    settings = SMOKE if cpu_smoke else GPU
    unit = "trials/hour (CPU smoke)" if cpu_smoke else "trials/GPU-hour"
    where = "CPU" if cpu_smoke else torch.cuda.get_device_name()
    print(f"\n== gpu_trial on {where} (torch {torch.__version__}): cohorts of the sweep's trials, "
          f"{settings['epochs']} epochs = {settings['epochs'] * settings['train_size'] // settings['batch_size']} "
          f"steps, {settings['train_size']} train examples, batch {settings['batch_size']}, bf16 autocast "
          f"{'off (CPU)' if cpu_smoke else 'on'}, compile backend {settings['backend']}; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  {'mode':>8} {'W':>2} {'K':>5} {unit + ' (steady)':>34} {'(incl. start)':>14} {'peak MiB':>9} "
          f"{'TFLOP/s':>8} {'of peak':>8} {'compile s':>9}")
    started, base, flops_shown = time.time(), None, False
    for size in settings["sizes"]:  # eager and compiled side by side, so a spent budget cuts pairs
        for workers in settings["workers"]:
            for mode in settings["modes"]:
                left = settings["budget_s"] - (time.time() - started)
                if left <= 0:
                    print(f"  {mode:>8} {workers:>2} {size:>5} skipped: the {settings['budget_s']:.0f} s budget is spent")
                    continue
                row = measure(size, workers, mode, settings, timeout=max(left, 120.0))
                base = base or row["steady"]
                note = f"  fell back: {row['fallback']}" if row["fallback"] else (
                    f"  {row['graphs']} graphs ({row['backend']}, warm-up {row['warm_up_s']:.1f} s)"
                    if row["graphs"] is not None else "")
                note += f"  in {row['chunks']} memory-sized chunks" if row["chunks"] > 1 else ""
                print(f"  {mode:>8} {workers:>2} {size:>5} {row['steady']:>34,.0f} {row['launch']:>14,.0f} "
                      f"{row['peak_mib']:>9.0f} {row['achieved'] / 1e12:>8.3f} "
                      f"{100 * row['achieved'] / PEAK_FLOPS:>7.4f}% {row['compile_s']:>9.1f}   "
                      f"{row['steady'] / base:5.1f}x ({row['finished']}/{row['trials']} finished){note}", flush=True)
                parts = row["parts"]
                print(f"    a worker's time, {parts['total']:.1f} s: creating the members "
                      f"{100 * parts['create'] / parts['total']:.0f}%, training passes "
                      f"{100 * parts['train'] / parts['total']:.0f}%, epoch ends and the rest "
                      f"{100 * parts['rest'] / parts['total']:.0f}%")
                if not flops_shown:
                    flops, flops_shown = row["flops"], True
                    print(f"    FLOPs (2mnk per matmul) at K={size}: forward {flops['forward_per_step']:.3e} per step, "
                          f"training 3x = {flops['train_per_step']:.3e} per step "
                          f"({flops['train_per_step'] / size:.3e} per member per step), epoch-end evaluation "
                          f"{flops['eval_per_epoch']:.3e} per epoch (apart)")
                if row["check"] is not None:
                    check = row["check"]
                    print(f"    compiled vs eager (every member's loss on one batch, rtol 2e-2 atol 2e-2): "
                          f"max abs {check['max_abs']:.3g}, max rel {check['max_rel']:.3g}: "
                          f"{'passed' if check['passed'] else 'FAILED'}")
    print(f"  peak: {PEAK_FLOPS / 1e12:.0f} TFLOP/s dense bf16 (H200); 'of peak' counts training-pass "
          "FLOPs over training-pass seconds")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny run on the CPU (for tests)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="eager", help=argparse.SUPPRESS)
    parser.add_argument("--first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.size, json.loads(args.worker), args.mode, args.first)
        sys.exit(0)
    sys.exit(main(args.cpu_smoke))

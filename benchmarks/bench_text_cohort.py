"""A real-text cohort member's epoch against a bare torch loop of the same model on the same rows.

Issue 51 ("seeds are the currency"): the WordNet adj/adv study spent 162-170 s an epoch per
25-member cohort (1,933 train rows, batch 32, 24 target tokens, SmolLM2's vocabulary compacted
to the dataset's ids). How much of that is the work itself? This benchmark builds a text
dataset of the same shape from text this machine ships (no download, no Debian package): the
summary lines of the docstrings of two families of installed libraries, numerics (numpy,
scipy) against web and storage (sqlalchemy, werkzeug, starlette, aiohttp, flask, alembic),
parsed with ``ast`` (nothing imported), de-duplicated, 2,300 per label, split by a hash of the
text 43 / 10 / 47 as the study was, word-level ids (the vocabulary a subword tokenizer gives
such text is of the same order), b_t a unigram model of the train split (``base_nll``, base
``precomputed``: b_t's source does not change an epoch's cost). It registers the table
(``canonicalize`` + ``DatasetStore.add``) and takes the study's spec
(``sweeps/examples/wordnet_adjadv.yaml``: model, training, loss stacks, KL options, read-outs)
with only the dataset and the base replaced; its first ``--members`` planned trials form the
cohort, as the study's sweep cut its 50 trials into cohorts of 25.

In one process, torch on one thread, alternating (half the floor runs before each cohort
epoch, half after it, so the load's drift falls on both sides):

- **member epoch**: ``open_cohort(...).run_epoch()`` (the cohort's training pass and each
  member's epoch end: val read-outs, train-subset read-outs, selection) over the cohort, per
  member; its training pass alone (``perf/epoch_seconds``) is printed beside it;
- **lone train pass**: ``Trainer.train_epoch`` of one member alone (the project's lone loop:
  its loss stack, its batch metrics);
- **the floor**: a bare torch loop of the same model (``Trainer.create``'s CVAE and AdamW) on
  the same rows: shuffled batches of 32, forward, masked mean token NLL plus KL, backward,
  step. Nothing else. Printed beside it with the epoch end's forwards added, bare (the model in
  eval mode, no gradient, over the rows the epoch-end read-outs read: the train subset and
  val): the work a member's epoch cannot skip, since val chooses the checkpoint.

Printed: wall and CPU seconds per member-epoch of each, and the ratios to the floor.

    python -m benchmarks.bench_text_cohort [--members 25] [--epochs 2] [--floor-members 3]
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import importlib.util
import math
import os
import platform
import re
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import yaml

from sweeps import SweepSpec, build_plan
from workers.cohort.chunked import open_cohort
from workers.contract import PERF_EPOCH_SECONDS
from workers.data.config import DatasetDataConfig
from workers.datasets.resolve import resolve_dataset
from workers.datasets.store import DatasetStore
from workers.datasets.table import canonicalize
from workers.readouts.split_data import readout_split
from workers.train import Trainer, TrialConfig

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "sweeps" / "examples" / "wordnet_adjadv.yaml"
FAMILIES = {"numerics": ("numpy", "scipy"),
            "web": ("sqlalchemy", "werkzeug", "starlette", "aiohttp", "flask", "alembic")}
SPLITS = (("train", 0.43), ("val", 0.53), ("test", 1.0))  # the study's 43 / 10 / 47
_WORDS = re.compile(r"[A-Za-z]+|\d+|[^\w\s]")


def _summaries(package: str) -> list[str]:
    """The first sentence of every docstring in ``package``'s source (parsed, not imported)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    lines = []
    for path in sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.py")):
        if "test" in path.parts or "tests" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc:
                    first = " ".join(doc.strip().split("\n\n")[0].split()).split(". ")[0]
                    if 20 <= len(first) <= 200 and not first.startswith((">>>", "..")):
                        lines.append(first.rstrip("."))
    return lines


def docstring_table(per_label: int = 2300, seed: int = 0) -> tuple[pa.Table, int]:
    """The two-label text table (module doc) and its vocabulary size."""
    texts: dict[str, set[str]] = {}
    for label, packages in FAMILIES.items():
        texts[label] = {t for p in packages for t in _summaries(p)}
    both = texts["numerics"] & texts["web"]  # ambiguous label: dropped, as build_wordnet does
    rng = np.random.default_rng(seed)
    rows = []
    for label, found in texts.items():
        kept = sorted(found - both)
        if len(kept) < per_label:
            raise SystemExit(f"{label}: {len(kept)} docstring lines, fewer than {per_label}")
        rows += [(text, label) for text in rng.permutation(kept)[:per_label]]

    def split_of(text: str) -> str:
        share = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 16**8
        return next(name for name, bound in SPLITS if share < bound)

    tokens = [[w.lower() for w in _WORDS.findall(text)] for text, _ in rows]
    splits = [split_of(text) for text, _ in rows]
    vocab = {w: i for i, (w, _) in enumerate(Counter(w for t in tokens for w in t).most_common())}
    counts = Counter(w for t, s in zip(tokens, splits, strict=True) if s == "train" for w in t)
    total = sum(counts.values())
    surprisal = {w: -math.log((counts[w] + 1) / (total + len(vocab))) for w in vocab}
    table = pa.table({
        "y": [[vocab[w] for w in t] for t in tokens],
        "label": [label for _, label in rows],
        "base_nll": [[surprisal[w] for w in t] for t in tokens],
        "split": splits,
    })
    return table, len(vocab)


def study_configs(data: DatasetDataConfig, members: int) -> list[TrialConfig]:
    """The study's first ``members`` planned trials on ``data`` (only data and base replaced)."""
    raw = yaml.safe_load(STUDY.read_text())
    raw["template"]["data"] = {**data.model_dump(mode="json", exclude_none=True),
                               "max_target_length": 24, "truncation": "head"}
    raw["template"]["base"] = {"kind": "precomputed"}
    spec = SweepSpec.model_validate(raw)
    trials = build_plan(spec).trials[:members]
    return [spec.trial_config(t["alpha"], t["loss_stack"], t["model"], t["seed"], t.get("beta"))
            for t in trials]


def _timed(run) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def bare_epoch(trainer: Trainer, generator: torch.Generator) -> None:
    """The floor: one pass of the trainer's own model and AdamW over its train rows, bare."""
    model, optimizer, data = trainer.model, trainer.optimizer, trainer.train_data
    split = data.split
    model.train()
    for indices in torch.randperm(len(split), generator=generator).split(trainer.config.training.batch_size):
        mask = split.mask[indices]
        out = model(split.context[indices], data.decoder_input[indices], split.target[indices], mask)
        loss = (out.token_nll * mask).sum() / mask.sum() + out.kl.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def bare_epoch_end(trainer: Trainer) -> None:
    """The epoch end's forwards, bare: the model over the rows its read-outs read (the train
    subset, val; test where read every epoch), no gradient, nothing computed from them."""
    model, training = trainer.model, trainer.config.training
    model.eval()
    with torch.no_grad():
        for name in trainer.config.readouts.epoch_splits():
            data = readout_split(trainer.splits[name], name, trainer.config.readouts.train_subset)
            split = data.split
            for indices in torch.arange(len(split)).split(training.eval_batch_size):
                model(split.context[indices], data.decoder_input[indices], split.target[indices],
                      split.mask[indices])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=2, help="cohort epochs timed")
    parser.add_argument("--floor-members", type=int, default=3,
                        help="members whose lone pass and bare floor are timed (one epoch each per round)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    table, vocab = docstring_table()
    with tempfile.TemporaryDirectory(prefix="ksweep-bench-text-") as folder:
        root = Path(folder)
        DatasetStore(root / "datasets").add(canonicalize(table, "docstrings.parquet"),
                                            name="docstrings", owner="bench")
        data = resolve_dataset(DatasetDataConfig(dataset="docstrings"), root / "datasets")
        configs = study_configs(data, args.members)
        cohort = open_cohort(configs, root)
        lone = [Trainer.create(configs[i], root) for i in range(args.floor_members)]
        bare = [Trainer.create(configs[i], root) for i in range(args.floor_members)]
        rows = len(lone[0].train_data.split)
        generator = torch.Generator().manual_seed(0)
        bare_epoch(bare[0], generator)  # warm-up: allocator, kernels
        member, passes, lone_t, floor_t, ends = [], [], [], [], []
        half = (len(bare) + 1) // 2
        for _ in range(args.epochs):  # alternate: floors, cohort epoch, lone passes, floors
            for trainer in bare[:half]:
                floor_t.append(_timed(lambda t=trainer: bare_epoch(t, generator)))
                ends.append(_timed(lambda t=trainer: bare_epoch_end(t)))
            holder: dict[int, dict[str, float]] = {}
            wall, cpu = _timed(lambda h=holder: h.update(cohort.run_epoch()))
            member.append((wall / len(configs), cpu / len(configs)))
            passes.append(next(iter(holder.values()))[PERF_EPOCH_SECONDS] / len(configs))
            for trainer in lone:
                lone_t.append(_timed(trainer.train_epoch))
            for trainer in bare[half:]:
                floor_t.append(_timed(lambda t=trainer: bare_epoch(t, generator)))
                ends.append(_timed(lambda t=trainer: bare_epoch_end(t)))
    floor_wall = statistics.median(w for w, _ in floor_t)
    floor_cpu = statistics.median(c for _, c in floor_t)
    lone_wall = statistics.median(w for w, _ in lone_t)
    lone_cpu = statistics.median(c for _, c in lone_t)
    print(f"# bench_text_cohort {started:%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__} on 1 thread; load before "
          f"{load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    print(f"data: docstring summary lines, 2 labels x 2,300, vocabulary {vocab:,} words; "
          f"{rows:,} train rows, batch {configs[0].training.batch_size}, "
          f"T {configs[0].data.max_target_length}; the study's spec (wordnet_adjadv.yaml), "
          f"base precomputed; cohort of {len(configs)} ({', '.join(sorted({c.loss_stack.name or '' for c in configs}))})")
    print(f"{'per member-epoch':<40} {'wall s':>8} {'CPU s':>8} {'x floor (wall)':>15} {'x floor (CPU)':>14}")
    for name, (wall, cpu) in (
            ("cohort epoch (train pass + epoch end)", (statistics.median(w for w, _ in member),
                                                       statistics.median(c for _, c in member))),
            ("  of which the cohort's train pass", (statistics.median(passes), math.nan)),
            ("lone Trainer.train_epoch", (lone_wall, lone_cpu)),
            ("floor: bare torch loop", (floor_wall, floor_cpu)),
            ("floor + the epoch end's forwards, bare", (
                floor_wall + statistics.median(w for w, _ in ends),
                floor_cpu + statistics.median(c for _, c in ends)))):
        print(f"{name:<40} {wall:>8.3f} {cpu:>8.3f} {wall / floor_wall:>14.2f}x {cpu / floor_cpu:>13.2f}x")
    print(f"epochs: cohort {[f'{w * len(configs):.1f}' for w, _ in member]} s wall per "
          f"{len(configs)}-member epoch; floor runs {[f'{w:.2f}' for w, _ in floor_t]} s")


if __name__ == "__main__":
    main()

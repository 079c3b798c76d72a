#!/usr/bin/env python
"""The label gate, run before any sweep: can a latent find this dataset's label at all, and what
else gives the label away? One column per dataset, one row per measure; JSON beside it.

    python -m scripts.label_gate --dataset wordnet --dataset fortunes --json gate.json

(from the repository root: run as a module, it imports ``scripts.kappa_distributions``).

For each registered dataset (``ksweep data add``; KSWEEP_DATA_ROOT / KSWEEP_SWEEP_ROOT as the
CLI reads them), on its train and test splits (its ``split`` column, else the split a sweep
would make with the default ``split_fractions``): the measures of
:mod:`workers.readouts.label_gate`, fitted on train and scored on test. The text is the
dataset's own ids decoded with the tokenizer it was registered with (bytes, or a registered
model's). The base model is the one whose tokenizer the dataset records (or ``--model``): b_t
(cached in the sweep root, as the sweeps cache it), kappa_1 and kappa_2 and the mean hidden
states of the last layer (cached beside it); with ``--no-lm``, or for a byte-tokenized dataset, b_t is a unigram
base of the train split (add-one smoothed) and there is no hidden-state ceiling.

A label whose unsupervised ceiling AMI is under 0.3 is marked "not for comparing stacks".
Exit status 0 whatever the verdicts (they are data); 2 for a dataset or model that cannot be read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ksweep.cli.common import default_data_root, default_model_root, default_sweep_root

ALPHAS = (1.0, 2.0)


def unigram_surprisal(ys: list[list[int]], train: np.ndarray) -> list[np.ndarray]:
    """b_t under the train split's token frequencies, add-one smoothed over the ids seen."""
    counts = Counter(t for i in np.flatnonzero(train) for t in ys[i])
    vocab = max(max(y) for y in ys) + 1
    total = sum(counts.values()) + vocab
    return [np.array([-np.log((counts[t] + 1) / total) for t in y], np.float32) for y in ys]


def decoder(tokenizer_name: str | None, model: Any) -> Any:
    """(ids -> text) for the tokenizer a dataset records; ``model`` holds the loaded tokenizer."""
    if tokenizer_name == "bytes":
        return lambda ids: bytes(int(i) for i in ids).decode("utf-8", errors="replace")
    if model is None:
        raise SystemExit(f"the dataset's tokenizer {tokenizer_name!r} is not the bytes one and no "
                         "registered model reads it; give --model NAME (`ksweep model list`)")
    tok = model["tokenizer"]
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def load_base(record: Any, name: str | None, use_lm: bool) -> dict[str, Any] | None:
    """The registered model reading this dataset's ids: its record, tokenizer and model."""
    from workers.lm.loading import load_registered, load_tokenizer
    from workers.lm.registry import ModelError, ModelStore, check_dataset_tokenizer

    tokenizer_name = record.tokenizer or ""
    name = name or (tokenizer_name.partition("@")[0] if "@" in tokenizer_name else None)
    if name is None:
        return None
    store = ModelStore(default_model_root())
    try:
        model_record = store.get(name)
        check_dataset_tokenizer(record.name, record.tokenizer, model_record)
    except ModelError as error:
        raise SystemExit(f"dataset {record.name!r}: {error}") from None
    if use_lm:
        model, tokenizer = load_registered(store, model_record)
    else:  # the tokenizer alone, to read the ids as text
        model, tokenizer = None, load_tokenizer(store.model_path(model_record),
                                                model_record.gguf_file)
    return {"record": model_record, "store": store, "model": model, "tokenizer": tokenizer}


def gate_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The gate's result for one registered dataset (module doc)."""
    from workers.data.config import DatasetDataConfig
    from workers.datasets.source import split_assignment
    from workers.datasets.store import DatasetNotFound, DatasetStore
    from workers.readouts.label_gate import GateSplit, run_gate

    store = DatasetStore(default_data_root())
    try:
        record = store.get(name)
    except DatasetNotFound as error:
        raise SystemExit(str(error)) from None
    table = store.open_table(record.sha256)
    if "label" not in table.column_names:
        raise SystemExit(f"dataset {name!r} has no label column: the gate reads a label")
    split = split_assignment(table, DatasetDataConfig(dataset=name))
    xs, ys = table.column("x").to_pylist(), table.column("y").to_pylist()
    labels = table.column("label").to_pylist()
    base = load_base(record, args.model, not args.no_lm)
    decode = decoder(record.tokenizer, base)
    texts = [decode(y) for y in ys]
    timings: dict[str, float] = {}
    states = None
    if base is not None and base["model"] is not None:
        from workers.lm.surprisal import cached_lm_base_nll

        started = time.perf_counter()
        lm = cached_lm_base_nll(xs, ys, dataset_sha256=record.sha256, store=base["store"],
                                record=base["record"], cache_root=default_sweep_root(),
                                train_rows=np.flatnonzero(split == 0).tolist())
        surprisal, base_name = lm.rows, base["record"].name
        timings["b_t_s"] = lm.seconds  # when it was computed (a cache hit costs nothing now)
        if not args.no_states:
            states = hidden_states(base, record.sha256, xs, ys, split, args, timings)
    else:
        surprisal, base_name = unigram_surprisal(ys, split == 0), "unigram of the train split"
    from scripts.kappa_distributions import kappas  # torch, once the rows are in hand

    kappa = {alpha: kappas(surprisal, alpha) for alpha in ALPHAS}

    def part(index: int) -> GateSplit:
        rows = np.flatnonzero(split == index)
        return GateSplit([texts[i] for i in rows], [ys[i] for i in rows], [labels[i] for i in rows],
                         [surprisal[i] for i in rows], {a: k[rows] for a, k in kappa.items()})

    started = time.perf_counter()
    result = run_gate(part(0), part(2), states=states, decode=lambda t: decode([t]), seed=args.seed)
    timings["gate_s"] = time.perf_counter() - started
    return {"dataset": name, "sha256": record.sha256, "tokenizer": record.tokenizer,
            "base": base_name, "timings_s": {k: round(v, 1) for k, v in timings.items()}, **result}


def hidden_states(base: dict[str, Any], dataset_sha256: str, xs: list, ys: list,
                  split: np.ndarray, args: argparse.Namespace,
                  timings: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Mean hidden states of (a seeded subsample of at most ``--lm-train-rows`` train rows,
    every test row), cached in the sweep root's ``lm_states/`` by content, model and rows."""
    from workers.lm.features import mean_hidden_states
    from workers.lm.loading import bos_token_id

    train = np.flatnonzero(split == 0)
    if len(train) > args.lm_train_rows:
        train = np.sort(np.random.default_rng(args.seed).choice(train, args.lm_train_rows, False))
    test = np.flatnonzero(split == 2)
    rows = np.concatenate([train, test])
    key = hashlib.sha256(json.dumps({"dataset": dataset_sha256, "model": base["record"].sha256,
                                     "layer": -1, "rows": rows.tolist()}).encode()).hexdigest()[:24]
    cache = default_sweep_root() / "lm_states" / f"{key}.npy"
    if cache.is_file():  # the same rows of the same content under the same model
        states = np.load(cache)
    else:
        started = time.perf_counter()
        states = mean_hidden_states(base["model"], [xs[i] for i in rows], [ys[i] for i in rows],
                                    bos_id=bos_token_id(base["model"], base["tokenizer"]))
        timings["hidden_states_s"] = time.perf_counter() - started
        cache.parent.mkdir(parents=True, exist_ok=True)
        staging = cache.with_suffix(f".{os.getpid()}.npy")
        np.save(staging, states)
        os.replace(staging, cache)
    return states[:len(train)], states[len(train):]


def _interval(cell: dict[str, float], key: str) -> str:
    return f"{cell[key]:.3f} [{cell['low']:.3f}, {cell['high']:.3f}]"


def _rho(values: dict[str, float]) -> str:
    per_label = [v for k, v in values.items() if k != "all" and np.isfinite(v)]
    spread = f" ({min(per_label):.2f} to {max(per_label):.2f} by label)" if per_label else ""
    return f"{values['all']:.2f}{spread}"


def table_rows(result: dict[str, Any]) -> dict[str, str]:
    """The printed cells of one dataset's column, by row name."""
    acc, unsup = result["accuracy"], result["unsupervised"]
    rows = {
        "rows train / test": f"{result['rows']['train']} / {result['rows']['test']}",
        "labels (test rows)": ", ".join(f"{k} {v}" for k, v in result["labels"].items()),
        "base (b_t)": result["base"],
        "ceiling: k-means on TF-IDF/LSA, AMI": _interval(unsup["tfidf_lsa_kmeans"], "ami"),
        "ceiling: k-means on LM states, AMI (not gating)": (
            _interval(unsup["lm_states_kmeans"], "ami") if "lm_states_kmeans" in unsup else "-"),
        "gate: lower 95% bound of the TF-IDF/LSA ceiling": f"{result['ceiling']['low']:.3f}",
    }
    for key, words in (("majority", "majority class"), ("length_only", "length only"),
                       ("formatting_only", "formatting only"),
                       ("length_formatting_frame", "length + formatting + frame"),
                       ("content_words", "content words"), ("bag_of_tokens", "bag of tokens")):
        rows[f"accuracy: {words}"] = _interval(acc[key], "accuracy")
    rows["best single token, test F1"] = ", ".join(
        f"{v['text'].strip()!r} {v['test_f1']:.2f}" for v in result["single_tokens"].values())
    for alpha, values in result.get("kappa_length_spearman", {}).items():
        rows[f"Spearman(kappa_{alpha.split('_')[1]}, length)"] = _rho(values)
    evidence = result.get("evidence_on_top_surprisal")
    if evidence:
        rows[f"evidence on top {evidence['top_fraction']:.0%} b_t tokens"] = (
            f"{_interval(evidence, 'share')} vs {evidence['null_share']:.3f} at random")
    for alpha, values in result.get("kappa_against_evidence", {}).items():
        rows[f"Spearman(kappa_{alpha.split('_')[1]}, label margin)"] = (
            f"{values['spearman']:.2f} ({values['given_length']:.2f} given length)")
    rows["verdict"] = result["verdict"]
    return rows


def render(results: list[dict[str, Any]]) -> None:
    """One column per dataset, then each dataset's flags."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table("measure (fit on train, scored on test)", *(r["dataset"] for r in results),
                  title="label gate", show_lines=False)
    cells = [table_rows(r) for r in results]
    for name in dict.fromkeys(k for c in cells for k in c):
        table.add_row(name, *(c.get(name, "-") for c in cells))
    console.print(table)
    for result in results:
        for flag in result["flags"] or ["no flags"]:
            console.print(f"{result['dataset']}: {flag}", highlight=False)


def markdown(results: list[dict[str, Any]]) -> str:
    """The printed table as Markdown, flags after it (for a write-up)."""
    cells = [table_rows(r) for r in results]
    lines = ["| measure | " + " | ".join(r["dataset"] for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for name in dict.fromkeys(k for c in cells for k in c):
        lines.append(f"| {name} | " + " | ".join(c.get(name, "-").replace("|", "/")
                                                 for c in cells) + " |")
    lines.append("")
    lines += [f"- {r['dataset']}: {flag}" for r in results for flag in r["flags"] or ["no flags"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", action="append", required=True,
                        help="a registered dataset (repeat for several columns)")
    parser.add_argument("--model", help="the base model (default: the one whose tokenizer the "
                        "dataset records)")
    parser.add_argument("--no-lm", action="store_true", help="unigram b_t, no hidden states")
    parser.add_argument("--no-states", action="store_true",
                        help="b_t from the model, but no hidden-state ceiling (the costly part)")
    parser.add_argument("--lm-train-rows", type=int, default=2000,
                        help="train rows whose hidden states k-means is fitted on (seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--markdown", type=Path, help="write the table here as Markdown")
    args = parser.parse_args(argv)
    results = [gate_one(name, args) for name in args.dataset]
    render(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=float) + "\n")
        print(f"written {args.json}")
    if args.markdown:
        args.markdown.write_text(markdown(results))
        print(f"written {args.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

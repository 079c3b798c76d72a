#!/usr/bin/env python
"""kappa_1 / kappa_2 of a labelled text dataset under a registered causal LM (a one-off study).

Steps, each through the project's own parts: register the model (``ModelStore``, GGUF or
folder), tokenize the text with its tokenizer and register the dataset (``canonicalize`` +
``DatasetStore``, recording the tokenizer), check the two tokenizers agree, compute b_t once
(``cached_lm_base_nll``, cached per dataset and model hash), then kappa_alpha per example
(``objectives.token_weight_stats``), per label and overall, beside a unigram base (token
frequencies of the train split, add-one smoothed) and the trivial-explanation controls.

    python -m scripts.lm_kappa --text fortunes.parquet --model DIR/SmolLM2.gguf --root /tmp/lm

(from the repository root: run as a module, it imports ``scripts.kappa_distributions``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from scripts.kappa_distributions import describe, kappas
from workers.datasets.store import DatasetStore
from workers.datasets.table import canonicalize, tokenizer_of
from workers.lm.loading import fingerprint_files
from workers.lm.registry import ModelStore, check_dataset_tokenizer
from workers.lm.surprisal import cached_lm_base_nll
from workers.lm.tokenizer import ModelTextTokenizer
from workers.readouts.controls import kappa_length_spearman, trivial_controls


def unigram_rows(ys: list[list[int]], train: np.ndarray, vocab: int) -> list[np.ndarray]:
    counts = Counter(t for i in np.flatnonzero(train) for t in ys[i])
    total = sum(counts.values()) + vocab
    return [np.array([-np.log((counts[t] + 1) / total) for t in y], np.float32) for y in ys]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", type=Path, required=True, help="Parquet: y_text, label, split")
    parser.add_argument("--model", type=Path, required=True, help="a .gguf file or a model folder")
    parser.add_argument("--name", default="smollm2")
    parser.add_argument("--root", type=Path, required=True, help="models/, datasets/, cache/")
    parser.add_argument("--per-label", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.perf_counter()
    models = ModelStore(args.root / "models")
    record = models.add(args.model, name=args.name, fingerprint=fingerprint_files)
    register_s = time.perf_counter() - started
    tok = ModelTextTokenizer.of(models, record)
    table = canonicalize(pq.read_table(args.text), args.text.name, tokenizer=tok)
    table = table.filter(pc.less_equal(pc.list_value_length(table.column("y")), args.max_tokens))
    rng = np.random.default_rng(0)
    labels = np.asarray(table.column("label").to_pylist())
    keep = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:args.per_label]
                                   for c in sorted(set(labels))]))
    table = table.take(pa.array(keep))
    datasets = DatasetStore(args.root / "datasets")
    dataset = datasets.add(table, name=f"fortunes-{args.name}", owner="lm_kappa",
                           tokenizer=tokenizer_of(table))
    check_dataset_tokenizer(dataset.name, dataset.tokenizer, record)
    xs, ys = table.column("x").to_pylist(), table.column("y").to_pylist()
    labels = np.asarray(table.column("label").to_pylist())
    split = np.asarray(table.column("split").to_pylist())
    lm = cached_lm_base_nll(xs, ys, dataset_sha256=dataset.sha256, store=models, record=record,
                            cache_root=args.root / "cache",
                            train_rows=np.flatnonzero(split == "train").tolist())
    uni = unigram_rows(ys, split == "train", int(record.vocab_size or 0))
    lengths = np.array([len(y) for y in ys])
    result: dict[str, object] = {
        "model": record.name, "model_sha256": record.sha256, "dataset_sha256": dataset.sha256,
        "rows": len(ys), "tokens": int(lengths.sum()), "length": describe(lengths.astype(float)),
        "register_s": round(register_s, 1), "b_t_seconds": round(lm.seconds, 1),
        "b_t_tokens_per_s": round(lm.tokens / lm.seconds, 1), "cache_hit": lm.cache_hit,
        "c_base_train": round(lm.c_base, 3),
    }
    for alpha in (1.0, 2.0):
        k = kappas(lm.rows, alpha)
        result[f"kappa_{alpha:g}"] = {"all": describe(k), **{
            c: describe(k[labels == c]) for c in sorted(set(labels))}}
        result[f"kappa_{alpha:g}_unigram"] = describe(kappas(uni, alpha))
        result[f"spearman_kappa_{alpha:g}_length"] = {
            g: round(v, 3) for g, v in kappa_length_spearman(k, lengths, labels).items()}
    by = {s: [ys[i] for i in np.flatnonzero(split == s)] for s in ("train", "test")}
    lab = {s: labels[split == s].tolist() for s in ("train", "test")}
    result["label_controls"] = {k: round(v, 3) for k, v in trivial_controls(by, lab).items()}
    result["total_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""The target-rate control on real text, with the known first-token case (issue 52's base).

Sentences of this project's own docs (docs/**/*.md, word ids), each given a balanced two-way
label written as its FIRST target token, x empty, a K = 2 discrete latent with a standard prior
and a bidirectional posterior. Every stack (uniform, R_tok, R~) is trained to 0.6 nats, most of
the one bit a K = 2 latent holds: the rate must be reached within 15%. A latent that must carry
most of a bit was expected to carry the label (AMI >= 0.9). It does not: measured
(docs/concepts/rates.md), z carries whether the sentence holds a word seen only once (the one id
all such words share; NMI 0.48 with that switch on train, AMI with the label 0.00, and the
decoder's loss on y_1 the same under both values of z). To an ideal decoder any balanced binary
property of y is worth log 2 nats, as the label is (a tie); the small decoder gains more from a
whole-sentence switch of its word distribution. The shared id is a pitfall but not the cause:
on closed-vocabulary WordNet glosses (no rare-word id), with more rows, a larger decoder, other
targets, step sizes and the collapse remedies, AMI stays about 0 (docs/concepts/rates.md has every
set-up tried). Those AMI checks are strict xfails: they fail today, and fail the suite the day the
case holds.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.support.datasets import label_in_first_token_table, register
from tests.support.groups import rate_text
from workers.contract import TRAIN_KL_MULTIPLIER, VAL_KL
from workers.data.config import DatasetDataConfig
from workers.datasets.resolve import resolve_dataset
from workers.train import Trainer, TrialConfig

pytestmark = rate_text  # the module's trained models are built once, on one worker
ROOT = Path(__file__).resolve().parents[2]
TARGET = 0.6  # nats per example: most of one bit, below log 2 = 0.693 (K = 2, standard prior: the ceiling)
STACKS = {"uniform": {"preset": "uniform"},
          "token_weighted": {"terms": {"token_weighted": 1.0}},
          "concentration_corrected": {"terms": {"concentration_corrected": 1.0}}}


def doc_sentences(limit: int, seed: int = 0) -> list[list[str]]:
    """Lower-case word sentences of 6-16 words from docs/**/*.md (code, maths, links dropped)."""
    text = " ".join(path.read_text() for path in sorted((ROOT / "docs").rglob("*.md")))
    text = re.sub(r"`[^`]*`|\$[^$]*\$|\[[^\]]*\]\([^)]*\)|\|", " ", text)
    sentences = [re.findall(r"[a-z]+", s.lower()) for s in re.split(r"(?<=[.!?;:])\s+", re.sub(r"\s+", " ", text))]
    sentences = [words for words in sentences if 6 <= len(words) <= 16]
    random.Random(seed).shuffle(sentences)
    return sentences[:limit]


def first_token_label_table(rows: int, seed: int = 0) -> pa.Table:
    """y = [label token] + the sentence's word ids (words seen once share one id), x empty."""
    sentences = doc_sentences(rows, seed)
    counts = Counter(word for words in sentences for word in words)
    vocab = {word: 10 + i for i, word in enumerate(sorted(w for w, n in counts.items() if n >= 2))}
    labels = np.random.default_rng(seed).permutation(np.arange(len(sentences)) % 2)
    ys = [[1 + int(label)] + [vocab.get(word, 9) for word in words] for label, words in zip(labels, sentences, strict=True)]
    return pa.table({"y": pa.array(ys, type=pa.list_(pa.int64())),
                     "x": pa.array([[] for _ in ys], type=pa.list_(pa.int64())),
                     "label": pa.array([f"label{label}" for label in labels])})


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Trainer]:
    root = tmp_path_factory.mktemp("first_label")
    register(root / "datasets", first_token_label_table(600), "docs_first_label")
    data = resolve_dataset(DatasetDataConfig(dataset="docs_first_label"), root / "datasets")
    trainers = {}
    for name, stack in STACKS.items():
        terms = {**stack.get("terms", {}), "kl": {"weight": 0.05, "options": {
            "target_rate": TARGET, "rate_control_lr": 0.05}}}
        config = TrialConfig.model_validate({
            "seed": 0, "data": data.model_dump(),
            "base": {"kind": "learned", "epochs": 3, "embedding_dim": 16, "hidden_dim": 32},
            "model": {"embedding_dim": 16, "hidden_dim": 32, "prior": "standard",
                      "target_encoder": "bidirectional"},
            "loss_stack": {**stack, "alpha": 1.0, "terms": terms},
            "training": {"epochs": 12, "batch_size": 32, "learning_rate": 3e-3, "device": "cpu"},
            "readouts": {"gradient_batch": 0, "train_subset": 128, "test_every_epoch": False}})
        trainer = Trainer.create(config, root)
        trainer.run()
        trainers[name] = trainer
    return trainers


@pytest.mark.slow
@pytest.mark.parametrize("stack", list(STACKS))
def test_every_stack_reaches_the_target_rate_on_text(trained, stack):
    history = trained[stack].history
    assert abs(history[VAL_KL][-1] - TARGET) <= 0.15 * TARGET, history[VAL_KL]
    assert history[TRAIN_KL_MULTIPLIER][-1] != 0.05  # the multiplier moved


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="known failure (docs/concepts/rates.md): z carries a "
                   "whole-sentence switch (a once-seen word or not), not the first-token label")
@pytest.mark.parametrize("stack", list(STACKS))
def test_at_a_low_rate_every_stack_carries_the_first_token_label(trained, stack):
    assert trained[stack].final_metrics["selected/test/latent_ami"] >= 0.9


@pytest.mark.slow
def test_where_the_label_is_the_only_information_the_controlled_latent_carries_it(tmp_path):
    """The positive control of the case above: every row's body the same (the label is all there
    is to know about y), the same latent and control: z carries the label, at the target rate."""
    register(tmp_path / "datasets", label_in_first_token_table(rows=480, classes=2, length=12), "label_first")
    data = resolve_dataset(DatasetDataConfig(dataset="label_first"), tmp_path / "datasets")
    config = TrialConfig.model_validate({
        "seed": 0, "data": data.model_dump(), "base": {"kind": "precomputed"},
        "model": {"embedding_dim": 16, "hidden_dim": 32, "prior": "standard",
                  "target_encoder": "bidirectional"},
        "loss_stack": {"preset": "uniform", "terms": {"kl": {"weight": 0.05, "options": {
            "target_rate": 0.65, "rate_control_lr": 0.05}}}},
        "training": {"epochs": 12, "batch_size": 32, "learning_rate": 3e-3, "device": "cpu"},
        "readouts": {"gradient_batch": 0, "test_every_epoch": False}})
    trainer = Trainer.create(config, tmp_path)
    trainer.run()
    assert abs(trainer.history[VAL_KL][-1] - 0.65) <= 0.15 * 0.65, trainer.history[VAL_KL]
    assert trainer.final_metrics["selected/test/latent_ami"] >= 0.9

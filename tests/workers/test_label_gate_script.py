"""The base model's mean hidden states (batched = one example alone, unpadded) and
``scripts/label_gate.py`` end to end on a dataset registered with a tiny Llama's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.support.tiny_lm import VOCAB, WORDS, build_tiny_llama
from workers.datasets.store import DatasetStore
from workers.datasets.table import canonicalize, tokenizer_of
from workers.lm.features import mean_hidden_states
from workers.lm.loading import fingerprint_files, load_model
from workers.lm.registry import ModelError, ModelStore
from workers.lm.tokenizer import ModelTextTokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def test_mean_hidden_states_equal_each_example_alone(tiny: Path) -> None:
    model = load_model(tiny)
    rng = np.random.default_rng(0)
    xs = [rng.integers(4, VOCAB, rng.integers(0, 5)).tolist() for _ in range(9)]
    ys = [rng.integers(4, VOCAB, rng.integers(1, 12)).tolist() for _ in range(9)]
    got = mean_hidden_states(model, xs, ys, bos_id=1, max_batch_tokens=64, progress=False)
    for x, y, row in zip(xs, ys, got, strict=True):
        ids = torch.tensor([[*(x or [1]), *y]])
        with torch.inference_mode():
            states = model.base_model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        np.testing.assert_allclose(row, states[0, -len(y):].mean(0).numpy(), rtol=1e-4, atol=1e-5)
    first = mean_hidden_states(model, xs, ys, bos_id=1, layer=0, progress=False)
    embedded = model.get_input_embeddings().weight.detach().numpy()
    np.testing.assert_allclose(first[0], embedded[ys[0]].mean(0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ModelError, match="row 1: y is empty"):
        mean_hidden_states(model, [[], []], [[5], []], bos_id=1, progress=False)


def test_gate_script_on_a_registered_dataset(tiny: Path, tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "root"
    monkeypatch.setenv("KSWEEP_SWEEP_ROOT", str(root))
    for key in ("KSWEEP_DATA_ROOT", "KSWEEP_MODEL_ROOT"):
        monkeypatch.delenv(key, raising=False)
    models = ModelStore(root / "models")
    record = models.add(tiny, name="tiny", fingerprint=fingerprint_files)
    rng = np.random.default_rng(0)
    labels = [("w0", "w1", "w2")[i % 3] for i in range(240)]  # the first word tells the class
    texts = [" ".join([c, *rng.choice(WORDS[3:], int(rng.integers(3, 9)))]) for c in labels]
    splits = ["train", "val", "test", "train", "test"] * 48
    table = canonicalize(pa.table({"y_text": texts, "label": labels, "split": splits}), "t.parquet",
                         tokenizer=ModelTextTokenizer.of(models, record))
    DatasetStore(root / "datasets").add(table, name="words", owner="me",
                                        tokenizer=tokenizer_of(table))
    from scripts import label_gate as gate

    out = tmp_path / "gate.json"
    table = tmp_path / "gate.md"
    assert gate.main(["--dataset", "words", "--json", str(out), "--markdown", str(table),
                      "--lm-train-rows", "50"]) == 0
    (result,) = json.loads(out.read_text())
    assert result["dataset"] == "words" and result["rows"] == {"train": 96, "test": 96}
    assert result["base"] == "tiny" and result["timings_s"]["b_t_s"] >= 0
    assert set(result["unsupervised"]) == {"tfidf_lsa_kmeans", "lm_states_kmeans"}
    # The tiny vocabulary's words (w0, w1, ...) are no content words: said, and read as the floor.
    assert result["unsupervised"]["tfidf_lsa_kmeans"]["ami"] == 0.0
    assert result["accuracy"]["content_words"]["note"].startswith("no content words")
    assert result["accuracy"]["bag_of_tokens"]["accuracy"] == 1.0
    assert {v["text"] for v in result["single_tokens"].values()} == {"w0", "w1", "w2"}
    assert set(result["kappa_length_spearman"]) == {"alpha_1", "alpha_2"}
    evidence = result["evidence_on_top_surprisal"]
    assert evidence["examples"] == 96 and 0 <= evidence["share"] <= 1
    # the first word is the label: the frame reads it, the (absent) content words do not
    assert result["accuracy"]["length_formatting_frame"]["accuracy"] == 1.0
    assert result["verdict"] == "not for comparing stacks"
    assert any("not well below the content words" in flag for flag in result["flags"])
    lines = table.read_text().splitlines()
    assert lines[0] == "| measure | words |" and any(
        line.startswith("| verdict | ") for line in lines) and any(
        line.startswith("| gate: lower 95% bound of the TF-IDF/LSA ceiling | 0.000 |") for line in lines)
    # b_t from the model (cached now) without the hidden-state ceiling.
    assert gate.main(["--dataset", "words", "--no-states", "--json", str(out)]) == 0
    (no_states,) = json.loads(out.read_text())
    assert no_states["base"] == "tiny" and set(no_states["unsupervised"]) == {"tfidf_lsa_kmeans"}
    assert no_states["evidence_on_top_surprisal"] == evidence
    # Again without the model: a unigram base, no hidden-state ceiling, the text read all the same.
    assert gate.main(["--dataset", "words", "--no-lm", "--json", str(out)]) == 0
    (plain,) = json.loads(out.read_text())
    assert plain["base"] == "unigram of the train split"
    assert set(plain["unsupervised"]) == {"tfidf_lsa_kmeans"}
    assert plain["accuracy"] == result["accuracy"]
    with pytest.raises(SystemExit, match="no dataset named 'nope'"):
        gate.main(["--dataset", "nope"])

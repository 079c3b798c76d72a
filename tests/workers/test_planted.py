"""The planted positive control (``ksweep data plant``): labels, carriers, kappa and the
information planted, on a small registered dataset with known answers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from objectives import token_weight_stats
from tests.support.datasets import register, strategy_table
from workers.datasets.planted import (
    VARIANTS,
    absent_tokens,
    balanced_labels,
    kappa,
    matched_surprisal,
    plant,
    planted_information,
)
from workers.datasets.store import DatasetStore

SPLIT_INDEX = {"train": 0, "val": 1, "test": 2}


def source_rows(rows: int = 400):
    table = strategy_table(rows, split=True)  # splits train, train, val, test repeated
    split = np.array([SPLIT_INDEX[s] for s in table.column("split").to_pylist()])
    return table, table.column("x").to_pylist(), table.column("y").to_pylist(), split


def test_kappa_is_the_objective_library_s():
    rng = np.random.default_rng(0)
    rows = [rng.uniform(0, 3, size=3 + i % 5) for i in range(20)]
    rows[0][:] = 0.0  # a row of zeros: kappa 1
    rows[1][1] = 0.0  # a zero among others: weight 0, counted in n
    width = max(map(len, rows))
    nll = torch.zeros(len(rows), width, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        nll[i, :len(row)], mask[i, :len(row)] = torch.as_tensor(row), True
    for alpha in (0.0, 1.0, 2.0):
        expected = token_weight_stats(nll, mask, alpha).kappa.numpy()
        np.testing.assert_allclose(kappa(rows, alpha), expected, rtol=1e-12)


def test_labels_tokens_and_information_have_known_values():
    split = np.array([0] * 10 + [1] * 5 + [2] * 6)
    labels = balanced_labels(split, seed=3)
    assert [int(labels[split == i].sum()) for i in range(3)] in ([5, 2, 3], [5, 3, 3])
    assert absent_tokens([[0, 2, 5], [1, 3]]) == (4, 6)
    # the token is the label: log 2 nats; independent of it: 0
    ys = [[7], [8]] * 10
    assert planted_information(ys, np.array([0, 1] * 10), (7, 8)) == pytest.approx(math.log(2))
    assert planted_information(ys, np.array([0, 0, 1, 1] * 5), (7, 8)) == pytest.approx(0.0)


def test_matched_surprisal_leaves_kappa_unchanged():
    rng = np.random.default_rng(1)
    for alpha in (0.5, 1.0, 2.0):
        for _ in range(5):
            row = rng.gamma(2.0, 2.0, size=int(rng.integers(3, 20)))
            x = matched_surprisal(row, alpha)
            assert kappa([np.append(row, x)], alpha)[0] == pytest.approx(kappa([row], alpha)[0],
                                                                         rel=1e-12)
            # the larger root: at or above the surprisal-weighted mean b_t
            assert x >= (row ** (alpha + 1)).sum() / (row ** alpha).sum() - 1e-9
    assert matched_surprisal(np.array([1.0, 3.0]), 0.0) == 2.0  # alpha 0: the mean


def test_the_variants_are_matched_and_their_carriers_sit_where_declared():
    _, xs, ys, split = source_rows()
    planted = plant(xs, ys, split, alpha=1.0, fraction=0.25, seed=0)
    assert planted.tokens == (0, 1)  # ids 0 and 1 occur nowhere in the source (offset 50,000)
    summaries = {v: planted.variants[v].summary for v in VARIANTS}
    # the same rows planted in every variant: round(0.25 x cell) per (split, label) cell
    counts = {v: s["rows_planted"] for v, s in summaries.items()}
    assert counts["concentrated"] == counts["diffuse"] == counts["null"] == {
        "train": 50, "val": 24, "test": 24}
    for index in range(3):  # balanced labels in every split, and among each split's carriers
        assert planted.labels[split == index].mean() == 0.5
        for entry in planted.variants.values():
            assert planted.labels[(split == index) & entry.carriers].mean() == 0.5
    # the same information in every variant: 98 carriers of 400 rows, each naming its label
    for summary in summaries.values():
        assert summary["information_nats"] == pytest.approx(98 / 400 * math.log(2), rel=1e-12)
        assert summary["information_train_nats"] == pytest.approx(50 / 200 * math.log(2), rel=1e-12)
    for entry in planted.variants.values():
        # one token more in the carriers, at the same place in every variant; none elsewhere
        grew = np.array([len(a) - len(b) for a, b in zip(entry.ys, ys, strict=True)])
        assert (grew == entry.carriers).all()
        assert all(y[p] == planted.labels[i] for i, (y, p) in enumerate(
            zip(entry.ys, planted.positions, strict=True)) if entry.carriers[i])
        # kappa recomputed after planting: unchanged (matched surprisal)
        np.testing.assert_allclose(entry.kappa_after, entry.kappa_before, rtol=1e-12)
    # carriers in their declared group; the null's at about the base rate
    concentrated, diffuse, null = (summaries[v] for v in VARIANTS)
    assert concentrated["share_in_declared_group"] >= 0.9
    assert diffuse["share_in_declared_group"] >= 0.9
    assert 0.1 <= null["share_in_declared_group"] <= 0.4
    assert concentrated["kappa_after"]["q25"] > diffuse["kappa_after"]["q75"]
    assert concentrated["kappa_after"]["mean"] > concentrated["kappa_after_other_rows"]["mean"]
    assert diffuse["kappa_after"]["mean"] < diffuse["kappa_after_other_rows"]["mean"]


def test_a_surprising_token_scored_by_the_base_moves_kappa_and_the_table_says_so():
    _, xs, ys, split = source_rows()
    planted = plant(xs, ys, split, surprisal="base")
    summaries = {v: planted.variants[v].summary for v in VARIANTS}
    # an absent token is rare to a unigram: every carrier's kappa rises...
    for summary in summaries.values():
        assert summary["kappa_after"]["mean"] > summary["kappa_before"]["mean"]
        assert summary["information_nats"] == pytest.approx(98 / 400 * math.log(2), rel=1e-12)
    # ...so the diffuse carriers, chosen by their kappa with the token, leave the bottom group
    assert summaries["concentrated"]["share_in_declared_group"] == 1.0
    assert summaries["diffuse"]["share_in_declared_group"] < 0.5


def test_bad_settings_are_refused_naming_them():
    _, xs, ys, split = source_rows()
    with pytest.raises(ValueError, match="fraction 0.6 must be in"):
        plant(xs, ys, split, fraction=0.6)
    with pytest.raises(ValueError, match="both 5"):
        plant(xs, ys, split, tokens=(5, 5))


def test_ksweep_data_plant_registers_three_datasets(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from ksweep.cli import app

    root = tmp_path / "sweeps"
    monkeypatch.setenv("KSWEEP_SWEEP_ROOT", str(root))
    monkeypatch.delenv("KSWEEP_DATA_ROOT", raising=False)
    monkeypatch.delenv("KSWEEP_URL", raising=False)
    table, *_ = source_rows()
    register(root / "datasets", table, "strat")
    runner = CliRunner()
    result = runner.invoke(app, ["data", "plant", "strat", "--alpha", "1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [v["dataset"] for v in out["variants"]] == [
        "strat-planted-concentrated", "strat-planted-diffuse", "strat-planted-null"]
    assert {v["information_nats"] for v in out["variants"]} == {out["variants"][0]["information_nats"]}
    store = DatasetStore(root / "datasets")
    for summary in out["variants"]:
        stored = store.open_table(store.get(summary["dataset"]).sha256)
        groups = stored.column("group").to_pylist()
        assert groups.count("evidence") == 98 and stored.column("label").to_pylist().count(1) == 200
        # base_nll holds the b_t the summary's kappa was computed from
        after = kappa([np.asarray(b) for b in stored.column("base_nll").to_pylist()], 1.0)
        carriers = np.array(groups) == "evidence"
        assert after[carriers].mean() == pytest.approx(summary["kappa_after"]["mean"], rel=1e-6)
    from rich.console import Console

    monkeypatch.setattr("ksweep.cli.planted.console", Console(width=200))
    printed = runner.invoke(app, ["data", "plant", "strat", "--prefix", "p", "--fraction", "0.5"])
    assert printed.exit_code == 0, printed.output
    lines = {line.split("│")[1].strip(): line for line in printed.output.splitlines()
             if line.startswith("│")}
    assert set(lines) == set(VARIANTS)
    for variant in VARIANTS:  # half of every cell of the train split (100 rows), 25 of 50 elsewhere
        assert f"p-{variant}" in lines[variant] and "100/50/50" in lines[variant]
        # on train: half the rows carry their label's token, I = 0.5 log 2
        assert f"({0.5 * math.log(2):.4f})" in lines[variant]
    assert "top 0.9" in lines["concentrated"] and "bottom 0.9" in lines["diffuse"]
    refused = runner.invoke(app, ["data", "plant", "strat", "--fraction", "0.7"])
    assert refused.exit_code == 2 and "fraction 0.7 must be in (0, 0.5]" in refused.output
    missing = runner.invoke(app, ["data", "plant", "nope"])
    assert missing.exit_code == 2 and "no dataset named 'nope'" in missing.output
    taken = runner.invoke(app, ["data", "plant", "strat", "--seed", "1"])
    assert taken.exit_code == 2 and "--replace" in taken.output


@pytest.mark.slow
def test_plant_with_a_registered_causal_lm_base(tmp_path: Path, monkeypatch) -> None:
    """``--model``: b_t from a registered causal LM reading the rows (the dataset tokenized
    with its tokenizer); with ``--surprisal base`` the LM scores the planted token in context."""
    import pyarrow as pa
    from typer.testing import CliRunner

    from ksweep.cli import app
    from tests.support.tiny_lm import WORDS, build_tiny_llama
    from workers.datasets.table import canonicalize, tokenizer_of
    from workers.lm.loading import fingerprint_files
    from workers.lm.registry import ModelStore
    from workers.lm.tokenizer import ModelTextTokenizer

    root = tmp_path / "sweeps"
    monkeypatch.setenv("KSWEEP_SWEEP_ROOT", str(root))
    for key in ("KSWEEP_DATA_ROOT", "KSWEEP_MODEL_ROOT", "KSWEEP_URL"):
        monkeypatch.delenv(key, raising=False)
    models = ModelStore(root / "models")
    record = models.add(build_tiny_llama(tmp_path / "tiny"), name="tiny", fingerprint=fingerprint_files)
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS[3:], int(rng.integers(3, 12)))) for _ in range(80)]
    table = canonicalize(pa.table({"y_text": texts, "split": ["train", "train", "val", "test"] * 20}),
                         "t.parquet", tokenizer=ModelTextTokenizer.of(models, record))
    DatasetStore(root / "datasets").add(table, name="words", owner="local",
                                        tokenizer=tokenizer_of(table))
    runner = CliRunner()
    result = runner.invoke(app, ["data", "plant", "words", "--model", "tiny", "--surprisal", "base",
                                 "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output[result.output.index("{"):])  # after the model's load messages
    assert out["base"] == "causal LM tiny" and out["config"]["tokens"] == [0, 1]  # <unk>, <s>
    for summary in out["variants"]:
        assert summary["rows_planted"] == {"train": 10, "val": 4, "test": 4}  # round(2.5) = 2
        assert summary["kappa_after"]["mean"] != summary["kappa_before"]["mean"]
        assert summary["information_nats"] == pytest.approx(18 / 80 * math.log(2), rel=1e-12)

"""scripts/rate_study.py: the known case's rows and its gate, on inputs with known answers."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from scripts import rate_study


def definitions() -> dict[str, list[str]]:
    """Glosses where 'common' words occur 5+ times and 'rare' ones once."""
    common = ["the", "a", "of", "an", "animal", "plant", "person", "made", "used", "with", "for", "from", "or"]
    texts = [" ".join(common[(i + j) % len(common)] for j in range(6 + i % 5)) for i in range(40)]
    return {"noun.animal": texts + ["the rare zebu of a plant person"], "adj.all": texts[:5]}


def test_closed_vocabulary_keeps_only_sentences_of_frequent_words_once_each():
    sentences = rate_study.closed_vocabulary_sentences(definitions())
    assert sentences and all("zebu" not in s for s in sentences)  # its one rare word drops it
    assert len(sentences) == len({tuple(s) for s in sentences})  # texts[:5] seen twice: kept once
    assert all(rate_study.MIN_WORDS <= len(s) <= rate_study.MAX_WORDS for s in sentences)


def test_known_case_rows_write_a_balanced_label_as_the_first_token():
    sentences = rate_study.closed_vocabulary_sentences(definitions())
    rows = rate_study.known_case_rows(sentences, rows=30, seed=3)
    assert len(rows) == 30 and all(row["x"] == [] for row in rows)
    for split in {row["split"] for row in rows}:
        counts = Counter(row["label"] for row in rows if row["split"] == split)
        assert abs(counts["label0"] - counts["label1"]) <= 1  # balanced within every split
    for row in rows:
        assert row["y"][0] == rate_study.LABEL_TOKENS[int(row["label"][-1])]
        assert min(row["y"][1:]) >= rate_study.FIRST_WORD_ID  # no word shares a label's id
    only = rate_study.label_only_rows(rows)
    assert len({tuple(row["y"][1:]) for row in only}) == 1  # one body: the label is all there is
    assert [row["y"][0] for row in only] == [row["y"][0] for row in rows]


@pytest.mark.parametrize(("amis", "code"), [((0.95, 1.0, 0.92), 0), ((0.95, 1.0, 0.5), 1)])
def test_the_gate_stops_the_chain_when_a_stack_misses_it(tmp_path, capsys, amis, code):
    stacks = ("uniform", "raw_token_weighted", "concentration_corrected")
    table = pd.DataFrame([{"loss_stack": s, "seed": seed, "selected/test/latent_ami": a + 0.01 * seed}
                          for s, a in zip(stacks, amis, strict=True) for seed in (0, 1)])
    table.to_csv(tmp_path / "trials.csv", index=False)
    assert rate_study.known_case_gate(tmp_path / "trials.csv") == code
    out = capsys.readouterr().out
    assert ("the chain stops at step 1" in out) == bool(code)
    assert "concentration_corrected" in out

"""scripts/build_wordnet.py on WordNet data files written here (and on the installed package
when there is one)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.scripts import load_script

bw = load_script("build_wordnet.py")
LICENSE = "  1 This software and database is being provided to you, the LICENSEE, by\n"


def synset(offset: int, lexfile: int, word: str, gloss: str, pos: str = "n") -> str:
    return f"{offset:08d} {lexfile:02d} {pos} 01 {word} 0 000 | {gloss}  \n"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "wordnet"
    root.mkdir()
    noun = [LICENSE]
    for i in range(30):
        noun.append(synset(i, 5, f"beast{i}", f"a furry beast number {i} of the woods; "
                                              f'"the beast{i} ran"'))
        noun.append(synset(100 + i, 20, f"herb{i}", f"a green herb number {i} of the fields"))
    noun.append(synset(200, 5, "dup", "a text found under two files"))
    noun.append(synset(201, 20, "dup", "a text found under two files"))
    noun.append(synset(202, 5, "twice", "a furry beast number 0 of the woods"))  # same file
    noun.append(synset(203, 6, "tool", "a tool"))  # too short
    (root / "data.noun").write_text("".join(noun))
    (root / "data.verb").write_text(LICENSE + "".join(
        synset(300 + i, 38, f"go{i}", f"move quickly in the manner number {i}", "v")
        for i in range(12)))
    (root / "data.adj").write_text(LICENSE)
    (root / "data.adv").write_text(LICENSE)
    return root


def test_definition_drops_examples_and_keeps_the_rest() -> None:
    assert bw.definition('a tangible entity; an entity that casts a shadow; "it was full"; '
                         '"rackets"') == "a tangible entity; an entity that casts a shadow"
    assert bw.definition('  move   fast;"run!"  ') == "move fast"
    assert bw.parse_line(LICENSE) is None
    assert bw.parse_line(synset(1, 18, "Lincoln", "16th President (1809-1865)")) == (
        "noun.person", "16th President (1809-1865)")
    assert len(bw.LEXNAMES) == 45 and bw.LEXNAMES[5] == "noun.animal"


def test_rows_are_deduplicated_balanced_and_split_by_text(folder: Path) -> None:
    definitions = bw.read_definitions(folder)
    assert set(definitions) == {"noun.animal", "noun.plant", "noun.artifact", "verb.motion"}
    rows, summary = bw.build_rows(definitions, labels=("noun.animal", "noun.plant"),
                                  min_chars=10, per_label=None)
    texts = [r["y_text"] for r in rows]
    assert "a text found under two files" not in texts  # ambiguous: dropped
    assert len(texts) == len(set(texts)) == 60 and summary["per_label"] == 30
    assert not any('"' in t for t in texts)
    assert summary["available"] == {"noun.animal": 30, "noun.plant": 30}
    assert all(r["split"] == bw.split_of(r["y_text"], (0.6, 0.1, 0.3)) for r in rows)
    again, _ = bw.build_rows(definitions, labels=("noun.plant", "noun.animal"), min_chars=10,
                             per_label=10, seed=3)
    split = {r["y_text"]: r["split"] for r in rows}
    assert all(split[r["y_text"]] == r["split"] for r in again)  # a text keeps its split
    assert sum(r["label"] == "noun.plant" for r in again) == 10
    by_pos, summary = bw.build_rows(definitions, labels=("noun", "verb"), min_chars=10)
    assert summary["per_label"] == 12 and {r["label"] for r in by_pos} == {"noun", "verb"}
    with pytest.raises(SystemExit, match="noun.animals"):
        bw.build_rows(definitions, labels=("noun.animals", "noun.plant"))
    with pytest.raises(SystemExit, match="has no definitions"):
        bw.build_rows(definitions, labels=("noun.animal", "noun.food"))


def test_main_writes_text_and_refuses_a_missing_package(folder: Path, tmp_path: Path,
                                                        capsys) -> None:
    out = tmp_path / "wn.parquet"
    assert bw.main(["--folder", str(folder), "--out", str(out), "--labels",
                    "noun.animal,noun.plant", "--min-chars", "10", "--fractions", "0.5,0.25,0.25"]) == 0
    table = pq.read_table(out)
    assert table.column_names == ["y_text", "x_text", "label", "split"] and table.num_rows == 60
    assert set(table.column("x_text").to_pylist()) == {""}
    assert bw.main(["--folder", str(tmp_path / "none"), "--out", str(out)]) == 2
    assert "apt-get install wordnet-base" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bw.main(["--folder", str(folder), "--fractions", "0.5,0.5"])


@pytest.mark.skipif(not (bw.WORDNET_DIR / "data.noun").is_file(), reason="wordnet-base not installed")
def test_the_installed_package_gives_a_test_split_of_2000(tmp_path: Path) -> None:
    rows, summary = bw.build_rows(bw.read_definitions(bw.WORDNET_DIR))
    assert summary["rows"] == 8000 and summary["per_label"] == 2000
    assert summary["splits"]["test"] >= 2000
    assert not any(r["y_text"].startswith('"') or '; "' in r["y_text"] for r in rows)

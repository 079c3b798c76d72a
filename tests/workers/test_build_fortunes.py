"""scripts/build_fortunes.py on a fortunes folder built here, with every trap of the real one."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.scripts import load_script

bf = load_script("build_fortunes.py")


def write_category(folder: Path, name: str, texts: list[str]) -> None:
    (folder / name).write_text("\n%\n".join(texts) + "\n%\n")
    (folder / f"{name}.dat").write_bytes(b"\x00\x00\x00\x02binary index")
    (folder / f"{name}.u8").symlink_to(name)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "fortunes"
    root.mkdir()
    for c, n in (("alpha", 12), ("beta", 10), ("gamma", 9), ("delta", 8), ("tiny", 2)):
        write_category(root, c, [f"The {c} fortune number {i} is long enough here.\n\t\t-- Author {c}"
                                 for i in range(n)] + ["A shared text in two categories, dropped."])
    # Italian files linked in (fortunes-it) and an Italian regular file.
    (tmp_path / "it").mkdir()
    write_category(tmp_path / "it", "italia", ["Più città è già perché così però"] * 20)
    (root / "italia").symlink_to(tmp_path / "it" / "italia")
    (root / "accenti").write_text("\n%\n".join(f"È già così città {i} perché però più"
                                               for i in range(30)))
    return root


def test_parse_and_clean() -> None:
    blocks = bf.parse_fortunes("one\nline\n%\n\n%\ntwo\n    -- Mark Twain\n%\n")
    assert blocks == ["one\nline", "two\n    -- Mark Twain"]
    assert bf.clean(blocks[1]) == "two"
    assert bf.clean("  -- only an attribution") == ""
    assert bf.clean("a  b\n\tc \u2014 inline dash stays") == "a b c \u2014 inline dash stays"


def test_build_rows_skips_traps_dedupes_and_balances(folder: Path) -> None:
    categories = bf.read_categories(folder)
    assert "italia" not in categories  # a symlink
    assert not any(name.endswith((".dat", ".u8")) for name in categories)
    rows, summary = bf.build_rows(categories, n_categories=4, min_per_category=8, min_chars=20)
    assert summary["categories"] == ["alpha", "beta", "delta", "gamma"]  # not accenti (Italian)
    assert summary["per_category"] == 8 and summary["rows"] == 32
    assert summary["ambiguous_dropped"] == 1
    assert not any("shared text" in r["y_text"] or "Author" in r["y_text"] for r in rows)
    assert {r["split"] for r in rows} <= {"train", "val", "test"}
    # The split is the text's alone: rebuilding with another seed keeps every text's split.
    again, _ = bf.build_rows(categories, n_categories=4, min_per_category=8, min_chars=20, seed=5)
    split = {r["y_text"]: r["split"] for r in rows}
    assert all(split[r["y_text"]] == r["split"] for r in again if r["y_text"] in split)
    with pytest.raises(SystemExit, match="only 3 categories have >= 9"):
        bf.build_rows(categories, n_categories=5, min_per_category=9, min_chars=20)


def test_main_writes_parquet_and_says_what_to_install(folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "f.parquet"
    assert bf.main(["--folder", str(folder), "--out", str(out), "--min-per-category", "8",
                    "--min-chars", "20"]) == 0
    table = pq.read_table(out)
    assert table.column_names == ["y_text", "x_text", "label", "split"] and table.num_rows == 32
    assert bf.main(["--folder", str(tmp_path / "missing")]) == 2
    assert "apt-get install fortunes" in capsys.readouterr().err


def test_per_category_caps_each_category_without_changing_which(folder: Path) -> None:
    categories = bf.read_categories(folder)
    full, _ = bf.build_rows(categories, n_categories=4, min_per_category=8, min_chars=20)
    rows, summary = bf.build_rows(categories, n_categories=4, min_per_category=8, min_chars=20,
                                  per_category=5)
    assert summary["categories"] == ["alpha", "beta", "delta", "gamma"]
    assert summary["per_category"] == 5 and summary["rows"] == 20
    assert all(sum(r["label"] == c for r in rows) == 5 for c in summary["categories"])
    split = {r["y_text"]: r["split"] for r in full}
    assert all(split.get(r["y_text"], r["split"]) == r["split"] for r in rows)
    # A cap above the smallest category's size changes nothing.
    same, _ = bf.build_rows(categories, n_categories=4, min_per_category=8, min_chars=20,
                            per_category=100)
    assert same == full

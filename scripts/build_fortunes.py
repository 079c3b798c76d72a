#!/usr/bin/env python
"""Build a labelled text dataset (label = category) from Debian's ``fortunes`` package.

Install first (this script installs nothing)::

    apt-get install fortunes          # the English files under /usr/share/games/fortunes/
    pip install 'kappa-sweep[lm]'     # only with --tokenizer (ids instead of text)

Each file of the folder is one category; fortunes are separated by ``%`` lines. The traps
handled, in order: ``.dat`` index files, ``.u8`` links and every other symlink are skipped
(``fortunes-it`` links Italian files into the same folder); non-English files are dropped
(share of ASCII letters, and a list of known non-English categories); attribution lines
(``-- Author``) are removed, since an author gives a category away; whitespace is collapsed;
texts are de-duplicated across the whole folder before anything else (a text found in two
categories is dropped, its label being ambiguous); texts outside the length bounds are dropped;
the largest ``--categories`` categories with at least ``--min-per-category`` texts are kept,
each subsampled (seeded) to the size of the smallest (or to ``--per-category``, when smaller);
the split is a function of the text's sha256 alone (80/10/10), so a text never changes split when categories or seeds change.

Writes a Parquet file with ``y_text`` (the fortune), ``x_text`` (empty), ``label`` (the
category) and ``split``; with ``--tokenizer FOLDER`` (a Hugging Face folder, or with
``--gguf-file``) ``x``/``y`` ids instead, and the tokenizer's fingerprint in the file's
metadata (``ksweep.tokenizer``).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

FORTUNES_DIR = Path("/usr/share/games/fortunes")
SPLIT_BOUNDS = (("train", 0.8), ("val", 0.9), ("test", 1.0))
NON_ENGLISH = frozenset({"it", "de", "fr", "es", "pl", "ru", "cs", "ga", "italia"})
_ATTRIBUTION = re.compile(r"^\s*(--|\u2014|\u2015)\s*\S")


def parse_fortunes(text: str) -> list[str]:
    """The fortunes of one file: blocks between lines holding only ``%``, stripped, non-empty."""
    blocks = re.split(r"^%\s*$", text, flags=re.MULTILINE)
    return [b.strip("\n") for b in blocks if b.strip()]


def clean(fortune: str) -> str:
    """Drop attribution lines (``-- Author``, em/horizontal-bar dashes too) and collapse
    whitespace to single spaces; may return "" (an attribution-only block)."""
    kept = [line for line in fortune.splitlines() if not _ATTRIBUTION.match(line)]
    return " ".join(" ".join(kept).split())


def is_english(texts: list[str], threshold: float = 0.97) -> bool:
    """Share of letters that are ASCII; accented languages fall below ``threshold``."""
    letters = [c for t in texts for c in t if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) / len(letters) >= threshold


def split_of(text: str) -> str:
    """train/val/test from the text's sha256 (80/10/10): stable under any other choice."""
    u = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64
    return next(name for name, bound in SPLIT_BOUNDS if u < bound)


def read_categories(folder: Path) -> dict[str, list[str]]:
    """Category -> cleaned fortunes, for every regular, non-index, non-link file."""
    out: dict[str, list[str]] = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink() or not path.is_file() or path.suffix in {".dat", ".u8"}:
            continue
        if path.name in NON_ENGLISH:
            continue
        texts = [clean(f) for f in parse_fortunes(path.read_text(encoding="utf-8", errors="replace"))]
        out[path.name] = [t for t in texts if t]
    return out


def build_rows(
    categories: dict[str, list[str]], *, n_categories: int = 4, min_per_category: int = 300,
    min_chars: int = 40, max_chars: int = 300, seed: int = 0, per_category: int | None = None,
) -> tuple[list[dict[str, str]], dict[str, object]]:
    """Rows ``{y_text, x_text, label, split}`` and a summary of what was dropped.

    Raises:
        SystemExit: fewer than ``n_categories`` English categories reach ``min_per_category``.
    """
    seen: dict[str, set[str]] = defaultdict(set)
    for name, texts in categories.items():
        for text in texts:
            seen[text].add(name)
    ambiguous = {t for t, names in seen.items() if len(names) > 1}
    unique: dict[str, list[str]] = {}
    for name, texts in categories.items():
        kept = sorted({t for t in texts if t not in ambiguous and min_chars <= len(t) <= max_chars})
        if is_english(kept):
            unique[name] = kept
    eligible = sorted((n for n, t in unique.items() if len(t) >= min_per_category),
                      key=lambda n: (-len(unique[n]), n))
    if len(eligible) < n_categories:
        sizes = {n: len(t) for n, t in sorted(unique.items(), key=lambda kv: -len(kv[1]))[:10]}
        raise SystemExit(f"only {len(eligible)} categories have >= {min_per_category} texts of "
                         f"{min_chars}-{max_chars} characters (largest: {sizes}); lower "
                         "--min-per-category or --categories, or widen the length bounds")
    chosen = sorted(eligible[:n_categories])
    size = min(len(unique[n]) for n in chosen)
    if per_category is not None:  # a smaller study: the same categories, fewer texts each
        size = min(size, per_category)
    rng = random.Random(seed)
    rows = [{"y_text": t, "x_text": "", "label": name, "split": split_of(t)}
            for name in chosen for t in sorted(rng.sample(unique[name], size))]
    summary = {"categories": chosen, "per_category": size, "rows": len(rows),
               "ambiguous_dropped": len(ambiguous),
               "splits": dict(Counter(r["split"] for r in rows))}
    return rows, summary


def write_parquet(rows: list[dict[str, str]], out: Path, tokenizer_folder: Path | None,
                  gguf_file: str | None, max_tokens: int | None) -> dict[str, object]:
    """Write the table (text, or ids with ``tokenizer_folder``); return what was written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    metadata: dict[str, str] = {}
    if tokenizer_folder is None:
        table = pa.Table.from_pylist(rows)
    else:
        from workers.lm.loading import load_tokenizer, tokenizer_fingerprint

        tokenizer = load_tokenizer(tokenizer_folder, gguf_file)
        ids = tokenizer([r["y_text"] for r in rows], add_special_tokens=False).input_ids
        keep = [i for i, y in enumerate(ids) if y and (max_tokens is None or len(y) <= max_tokens)]
        table = pa.table({
            "x": pa.array([[] for _ in keep], type=pa.list_(pa.int64())),
            "y": pa.array([ids[i] for i in keep], type=pa.list_(pa.int64())),
            "label": [rows[i]["label"] for i in keep], "split": [rows[i]["split"] for i in keep],
        })
        metadata["ksweep.tokenizer"] = tokenizer_fingerprint(tokenizer)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return {"rows": table.num_rows, **metadata}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("fortunes.parquet"))
    parser.add_argument("--folder", type=Path, default=FORTUNES_DIR)
    parser.add_argument("--categories", type=int, default=4, choices=range(4, 9), metavar="4-8")
    parser.add_argument("--min-per-category", type=int, default=300)
    parser.add_argument("--min-chars", type=int, default=40)
    parser.add_argument("--max-chars", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-category", type=int, help="at most this many texts per category")
    parser.add_argument("--tokenizer", type=Path, help="write ids with this tokenizer (folder)")
    parser.add_argument("--gguf-file", help="the tokenizer is in this GGUF file of --tokenizer")
    parser.add_argument("--max-tokens", type=int, help="with --tokenizer: drop longer texts")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"{args.folder}: not found; install Debian's fortunes first: apt-get install "
              "fortunes", file=sys.stderr)
        return 2
    rows, summary = build_rows(
        read_categories(args.folder), n_categories=args.categories,
        min_per_category=args.min_per_category, min_chars=args.min_chars,
        max_chars=args.max_chars, seed=args.seed, per_category=args.per_category)
    written = write_parquet(rows, args.out, args.tokenizer, args.gguf_file, args.max_tokens)
    print({**summary, **written, "out": str(args.out)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

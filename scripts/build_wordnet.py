#!/usr/bin/env python
"""Build a labelled text dataset from WordNet's glosses (Debian's ``wordnet-base``), label =
lexicographer file (``noun.animal``, ``noun.plant``, ...) or part of speech.

Install first (this script installs nothing)::

    apt-get install wordnet-base      # /usr/share/wordnet/data.{noun,verb,adj,adv}

Each synset line of ``data.*`` carries its lexicographer file number and its gloss after
``|``. What the script does, in order, and why:

- **Definitions only.** A gloss is ``definition; "example"; "example"``: the quoted example
  sentences are dropped. They use the synset's own word ("the dog barked all night"), their
  presence differs by file (1% of noun.animal glosses have one, 25% of noun.cognition, 67% of
  verb.motion), and their quote marks would hand a formatting classifier the label.
- **Lemma words are kept.** The label is the file, not the synset: a definition naming its own
  word ("white oak: an oak ...") says which synset, and its word is ordinary content of its
  file. Masking it would leave text the base model never reads.
- **De-duplicated before anything else**: a definition found under two labels is dropped (its
  label is ambiguous), one found twice under one label is kept once.
- **Length bounds** (``--min-chars``/``--max-chars``) on the definition.
- **Balanced**: every label subsampled (seeded) to the smallest one's size, or to
  ``--per-label`` when that is smaller.
- **Split by a hash of the text** (``--fractions``, default 0.6/0.1/0.3 train/val/test): a
  text never changes split when labels, bounds or seeds change. The default sizes
  (4 labels x 2,000) give a test split of about 2,400 rows.

``--labels`` takes lexicographer files (``noun.animal``) or parts of speech (``noun``,
``verb``, ``adj``, ``adv``: every file of that part of speech). Writes a Parquet file with
``y_text`` (the definition), ``x_text`` (empty), ``label`` and ``split``; register it with the
base model's tokenizer::

    ksweep data add wordnet.parquet --name wordnet --tokenizer smollm2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path

from workers.contract import SPLITS  # train, val, test: the names every reader of a dataset uses

WORDNET_DIR = Path("/usr/share/wordnet")
DATA_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
# WordNet 3.0's lexicographer files by number (lexnames(5WN); the package ships no lexnames file).
LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
    "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event",
    "noun.feeling", "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object",
    "noun.person", "noun.phenomenon", "noun.plant", "noun.possession", "noun.process",
    "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition",
    "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather",
    "adj.ppl",
)
DEFAULT_LABELS = ("noun.animal", "noun.artifact", "noun.person", "noun.plant")


def definition(gloss: str) -> str:
    """The gloss without its quoted example sentences (``;``-separated parts starting with
    ``"``), whitespace collapsed."""
    parts = [p.strip() for p in gloss.split(";")]
    return " ".join("; ".join(p for p in parts if p and not p.startswith('"')).split())


def parse_line(line: str) -> tuple[str, str] | None:
    """(lexicographer file, definition) of one synset line of a ``data.*`` file; None for the
    license header (lines starting with two spaces) and glossless lines."""
    if line.startswith("  ") or " | " not in line:
        return None
    head, _, gloss = line.partition(" | ")
    fields = head.split()
    return LEXNAMES[int(fields[1])], definition(gloss)


def read_definitions(folder: Path) -> dict[str, list[str]]:
    """Lexicographer file -> its definitions, in file order (duplicates kept)."""
    out: dict[str, list[str]] = defaultdict(list)
    for name in DATA_FILES:
        with open(folder / name, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parsed = parse_line(line)
                if parsed is not None and parsed[1]:
                    out[parsed[0]].append(parsed[1])
    return dict(out)


def label_of(lexname: str, labels: tuple[str, ...]) -> str | None:
    """The label a lexicographer file counts for: itself, its part of speech, or None."""
    if lexname in labels:
        return lexname
    pos = lexname.partition(".")[0]
    return pos if pos in labels else None


def split_of(text: str, fractions: tuple[float, float, float]) -> str:
    """train/val/test from the text's sha256: stable under any other choice."""
    u = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64
    bound = 0.0
    for name, fraction in zip(SPLITS, fractions, strict=True):
        bound += fraction
        if u < bound:
            return name
    return SPLITS[-1]


def build_rows(
    definitions: dict[str, list[str]], *, labels: tuple[str, ...] = DEFAULT_LABELS,
    min_chars: int = 20, max_chars: int = 200, per_label: int | None = 2000, seed: int = 0,
    fractions: tuple[float, float, float] = (0.6, 0.1, 0.3),
) -> tuple[list[dict[str, str]], dict[str, object]]:
    """Rows ``{y_text, x_text, label, split}`` and a summary of what was dropped.

    Raises:
        SystemExit: an unknown label, or a label left without texts.
    """
    known = set(LEXNAMES) | {n.partition(".")[0] for n in LEXNAMES}
    unknown = sorted(set(labels) - known)
    if unknown or len(set(labels)) < 2:
        raise SystemExit(f"--labels: {unknown or list(labels)}: give at least two of the "
                         f"lexicographer files ({', '.join(LEXNAMES)}) or parts of speech "
                         "(noun, verb, adj, adv)")
    seen: dict[str, set[str]] = defaultdict(set)
    for lexname, texts in definitions.items():
        label = label_of(lexname, labels)
        for text in texts:
            seen[text].add(label or lexname)  # a text also found outside the labels is ambiguous
    ambiguous = {t for t, owners in seen.items() if len(owners) > 1}
    kept: dict[str, list[str]] = {label: [] for label in labels}
    for text, owners in seen.items():
        (owner,) = owners if len(owners) == 1 else (None,)
        if owner in kept and min_chars <= len(text) <= max_chars:
            kept[owner].append(text)
    sizes = {label: len(texts) for label, texts in kept.items()}
    size = min(sizes.values())
    if size == 0:
        raise SystemExit(f"a label has no definitions of {min_chars}-{max_chars} characters: "
                         f"{sizes}; widen the bounds or choose other labels")
    if per_label is not None:
        size = min(size, per_label)
    rng = random.Random(seed)
    rows = [{"y_text": t, "x_text": "", "label": label, "split": split_of(t, fractions)}
            for label in labels for t in sorted(rng.sample(sorted(kept[label]), size))]
    summary = {"labels": list(labels), "available": sizes, "per_label": size, "rows": len(rows),
               "ambiguous_dropped": len(ambiguous),
               "duplicates_dropped": sum(len(t) for t in definitions.values()) - len(seen),
               "splits": dict(Counter(r["split"] for r in rows))}
    return rows, summary


def fractions_arg(text: str) -> tuple[float, float, float]:
    """``0.6,0.1,0.3`` -> the train/val/test fractions (positive, summing to 1)."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) <= 0 or abs(sum(values) - 1) > 1e-9:
        raise argparse.ArgumentTypeError(f"{text!r}: three positive fractions summing to 1, "
                                         "e.g. 0.6,0.1,0.3")
    return values  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("wordnet.parquet"))
    parser.add_argument("--folder", type=Path, default=WORDNET_DIR)
    parser.add_argument("--labels", default=",".join(DEFAULT_LABELS),
                        help="comma-separated lexicographer files or parts of speech")
    parser.add_argument("--per-label", type=int, default=2000,
                        help="at most this many definitions per label (0: all of the smallest)")
    parser.add_argument("--min-chars", type=int, default=20)
    parser.add_argument("--max-chars", type=int, default=200)
    parser.add_argument("--fractions", type=fractions_arg, default=(0.6, 0.1, 0.3),
                        help="train,val,test fractions of the text hash (default 0.6,0.1,0.3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not all((args.folder / name).is_file() for name in DATA_FILES):
        print(f"{args.folder}: no WordNet data files ({', '.join(DATA_FILES)}); install them "
              "first: apt-get install wordnet-base", file=sys.stderr)
        return 2
    rows, summary = build_rows(
        read_definitions(args.folder), labels=tuple(args.labels.split(",")),
        min_chars=args.min_chars, max_chars=args.max_chars, per_label=args.per_label or None,
        seed=args.seed, fractions=args.fractions)
    import pyarrow as pa
    import pyarrow.parquet as pq

    args.out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), args.out)
    print(json.dumps({**summary, "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

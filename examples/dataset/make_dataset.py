"""Write a small dataset in the registry's format: stories whose opening reveals a genre.

Each row: ``x`` a short prompt (token ids), ``y`` the story (its first two tokens are drawn
from the genre's own block, the rest from a shared body vocabulary, so the surprisal
concentrates at the start), ``label`` the genre, ``group`` ``short`` or ``long``. Ids start
at 10_000, as a tokenizer's would, so the trainer compacts them.

    python examples/dataset/make_dataset.py stories.parquet [--rows 600] [--no-label]
    ksweep data add stories.parquet --name stories
    ksweep sweep run examples/dataset/spec.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

GENRES = ("mystery", "romance", "horror")
FIRST_ID = 10_000


def stories(rows: int, seed: int = 0, label: bool = True) -> pa.Table:
    """The table (columns x, y, label, group); deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    genre = rng.integers(0, len(GENRES), size=rows)
    body_vocab, block = 24, 3
    ys, xs = [], []
    for n in range(rows):
        opening = FIRST_ID + body_vocab + block * int(genre[n]) + rng.integers(0, block, size=2)
        body = FIRST_ID + rng.integers(0, body_vocab, size=int(rng.integers(3, 9)))
        ys.append([*opening.tolist(), *body.tolist()])
        xs.append((FIRST_ID + rng.integers(0, body_vocab, size=int(rng.integers(1, 4)))).tolist())
    columns = {"x": pa.array(xs, type=pa.list_(pa.int64())),
               "y": pa.array(ys, type=pa.list_(pa.int64())),
               "group": pa.array(["short" if len(y) <= 6 else "long" for y in ys])}
    if label:
        columns["label"] = pa.array([GENRES[g] for g in genre])
    return pa.table(columns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the Parquet file to write")
    parser.add_argument("--rows", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-label", action="store_true", help="leave the label column out")
    args = parser.parse_args()
    table = stories(args.rows, args.seed, label=not args.no_label)
    pq.write_table(table, args.out)
    print(f"wrote {table.num_rows} rows to {args.out}")


if __name__ == "__main__":
    main()

"""The real-text study at a priced, matched rate, step by step; a step that fails stops the chain.

    python -m scripts.rate_study [--work DIR] [--only build|datasets|known-case] [--dry-run]

Step 1 of the study (docs/science/real_text_rate.md) is the known case: WordNet definitions
over a closed vocabulary, each given a balanced two-way label written as its first target token,
trained by every stack to one target rate below log 2. There the label should be the cheapest
information in y, and every stack's latent should carry it (test AMI >= 0.9). Steps:

    build        WORK/known_case.parquet: word ids of 3,000 definitions (6-16 words, every word
                 seen at least 5 times in WordNet's glosses: no rare-word id), label token first;
                 WORK/label_only.parquet: the same rows, labels and splits with every body
                 replaced by one definition (the label is all there is to know about y)
    datasets     ksweep data add --local (`wordnet-first-label`, `wordnet-label-only`)
    known-case   ksweep serve; submit the positive control (sweeps/examples/rate_known_case.yaml
                 on `wordnet-label-only`), then the case itself; watch each (timed); report
                 (json, md, terminal) and the trials table into WORK/reports/<sweep>/; then the
                 gate: every stack's mean test AMI >= 0.9 on both, or the chain stops here

The later steps (the planted control, then two real label sets) run only after the known case
passes; they are the study's next sweeps and are not in this script until then.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

from scripts.build_wordnet import WORDNET_DIR, read_definitions, split_of
from scripts.real_text_study import environment, record_timing
from scripts.wordnet_study import run

ROOT = Path(__file__).resolve().parents[1]
DATASET, CONTROL_DATASET = "wordnet-first-label", "wordnet-label-only"
KNOWN_CASE_SPEC = ROOT / "sweeps" / "examples" / "rate_known_case.yaml"
KNOWN_CASE_SWEEP, CONTROL_SWEEP = "rate-known-case", "rate-label-only"
ROWS, MIN_WORDS, MAX_WORDS, MIN_COUNT = 3000, 6, 16, 5
FRACTIONS = (0.6, 0.1, 0.3)
LABEL_TOKENS = (1, 2)  # the label's two tokens; word ids start at FIRST_WORD_ID
FIRST_WORD_ID = 10
KNOWN_CASE_AMI = 0.9  # the gate of step 1: the label is the cheapest information there is
STEPS = ("build", "datasets", "known-case")


def closed_vocabulary_sentences(definitions: dict[str, list[str]]) -> list[list[str]]:
    """Lower-case word lists of the definitions of MIN_WORDS-MAX_WORDS words all of whose words
    occur at least MIN_COUNT times in the whole gloss corpus; de-duplicated, sorted."""
    texts = [re.findall(r"[a-z]+", text.lower()) for group in definitions.values() for text in group]
    counts = Counter(word for words in texts for word in words)
    kept = {tuple(words) for words in texts
            if MIN_WORDS <= len(words) <= MAX_WORDS and all(counts[w] >= MIN_COUNT for w in words)}
    return [list(words) for words in sorted(kept)]


def known_case_rows(sentences: list[list[str]], rows: int = ROWS, seed: int = 0) -> list[dict]:
    """``rows`` sentences drawn (seeded), split by a hash of their text, each with a label
    balanced within its split; y = [the label's token] + the sentence's word ids, x empty."""
    drawn = random.Random(seed).sample(sentences, rows)
    vocabulary = {w: FIRST_WORD_ID + i for i, w in enumerate(sorted({w for s in drawn for w in s}))}
    by_split: dict[str, list[list[str]]] = {}
    for words in drawn:
        by_split.setdefault(split_of(" ".join(words), FRACTIONS), []).append(words)
    rng = random.Random(seed + 1)
    out = []
    for split, group in sorted(by_split.items()):
        labels = [i % 2 for i in range(len(group))]
        rng.shuffle(labels)
        out += [{"y": [LABEL_TOKENS[label]] + [vocabulary[w] for w in words], "x": [],
                 "label": f"label{label}", "split": split, "text": " ".join(words)}
                for label, words in zip(labels, group, strict=True)]
    return out


def label_only_rows(rows: list[dict]) -> list[dict]:
    """The positive control: ``rows`` with every body replaced by the first row's."""
    body = rows[0]["y"][1:]
    return [{**row, "y": row["y"][:1] + body} for row in rows]


def write_table(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"y": pa.array([r["y"] for r in rows], type=pa.list_(pa.int64())),
                             "x": pa.array([r["x"] for r in rows], type=pa.list_(pa.int64())),
                             "label": [r["label"] for r in rows],
                             "split": [r["split"] for r in rows]}), path)


def build(work: Path) -> None:
    rows = known_case_rows(closed_vocabulary_sentences(read_definitions(WORDNET_DIR)))
    write_table(rows, work / "known_case.parquet")
    write_table(label_only_rows(rows), work / "label_only.parquet")
    summary = {"rows": len(rows), "vocabulary": len({t for r in rows for t in r["y"][1:]}),
               "splits": dict(Counter(r["split"] for r in rows)),
               "labels_by_split": {s: dict(Counter(r["label"] for r in rows if r["split"] == s))
                                   for s in ("train", "val", "test")},
               "mean_words": round(sum(len(r["y"]) - 1 for r in rows) / len(rows), 2)}
    (work / "known_case.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


def datasets(work: Path) -> None:
    for name, file in ((DATASET, "known_case.parquet"), (CONTROL_DATASET, "label_only.parquet")):
        run([sys.executable, "-m", "ksweep.cli", "data", "add", str(work / file), "--name", name,
             "--local", "--replace"], environment(work))


def control_spec(work: Path) -> Path:
    """The known case's spec on the label-only rows."""
    spec = yaml.safe_load(KNOWN_CASE_SPEC.read_text())
    spec["name"], spec["template"]["data"]["dataset"] = CONTROL_SWEEP, CONTROL_DATASET
    spec["description"] = "Step 1's positive control: the known case's sweep on rows whose body is one sentence."
    path = work / "rate_label_only.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def known_case(work: Path, only: tuple[str, ...] = ()) -> int:
    """The positive control's sweep, then the known case's (``only``: these names), through the
    service; 0 when every stack passes the gate on each."""
    from tests.support.serve_process import ServeProcess, free_port

    port = free_port()
    env = {**environment(work), "KSWEEP_HOST": "127.0.0.1", "KSWEEP_PORT": str(port),
           "KSWEEP_URL": f"http://127.0.0.1:{port}"}
    server = ServeProcess(env, work / "serve.log", port=port, host="127.0.0.1")
    server.start(timeout_s=120, probe="/readyz")
    try:
        sweeps = [(spec, name) for spec, name in ((control_spec(work), CONTROL_SWEEP),
                                                  (KNOWN_CASE_SPEC, KNOWN_CASE_SWEEP))
                  if not only or name in only]
        return max(known_case_gate(run_sweep(spec, name, work, env)) for spec, name in sweeps)
    finally:
        server.stop(timeout_s=60)


def run_sweep(spec: Path, name: str, work: Path, env: dict[str, str]) -> Path:
    """Submit, watch (timed), report and export one sweep; its trials table's path."""
    ksweep = [sys.executable, "-m", "ksweep.cli"]
    target = work / "reports" / name
    target.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    sweep_id = run([*ksweep, "submit", str(spec)], env).strip().splitlines()[-1]
    started = time.perf_counter()
    watched = subprocess.run([*ksweep, "watch", sweep_id], cwd=ROOT, env=env)
    record_timing(work, name, {"sweep_id": sweep_id, "wall_s": round(time.perf_counter() - started, 1),
                               "exit": watched.returncode, "load_before": load,
                               "load_after": os.getloadavg()})
    run([*ksweep, "report", sweep_id, "--format", "json"], env, target / "report.json", quiet=True)
    run([*ksweep, "report", sweep_id, "--format", "md"], env, target / "report.md", quiet=True)
    run([*ksweep, "export", sweep_id, "--table", "trials", "--format", "csv", "--output",
         str(target / "trials.csv")], env)
    run([*ksweep, "report", sweep_id], {**env, "COLUMNS": "80"}, target / "report.txt")
    return target / "trials.csv"


def known_case_gate(trials_csv: Path) -> int:
    """Print each stack's test AMI (mean, min, max over seeds); 0 when every mean is >= the gate."""
    import pandas as pd

    trials = pd.read_csv(trials_csv)
    means = trials.groupby("loss_stack")["selected/test/latent_ami"].agg(["mean", "min", "max", "count"])
    print(means.round(3).to_string())
    failing = sorted(means.index[means["mean"] < KNOWN_CASE_AMI])
    if failing:
        print(f"the chain stops at step 1: mean test AMI below {KNOWN_CASE_AMI} for {', '.join(failing)}")
        return 1
    print("step 1 holds: every stack carries the first-token label")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / ".ksweep" / "rate_study")
    parser.add_argument("--only", choices=STEPS, help="run this one step")
    parser.add_argument("--sweeps", default="", help="known-case runs only these, comma-separated "
                        f"({CONTROL_SWEEP}, {KNOWN_CASE_SWEEP})")
    parser.add_argument("--dry-run", action="store_true", help="print the steps; run nothing")
    args = parser.parse_args(argv)
    only = tuple(filter(None, args.sweeps.split(",")))
    if unknown := sorted(set(only) - {CONTROL_SWEEP, KNOWN_CASE_SWEEP}):
        parser.error(f"--sweeps {','.join(unknown)}: choose from {CONTROL_SWEEP}, {KNOWN_CASE_SWEEP}")
    work = args.work.resolve()
    for name in [args.only] if args.only else list(STEPS):
        print(f"[{STEPS.index(name) + 1}/{len(STEPS)}] {name}", flush=True)
        if args.dry_run:
            continue
        work.mkdir(parents=True, exist_ok=True)
        if name == "build":
            build(work)
        elif name == "datasets":
            datasets(work)
        elif known_case(work, only) != 0:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

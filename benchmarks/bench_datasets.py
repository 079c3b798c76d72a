"""Dataset registration at scale: a 1,000,000-row dataset registered, and its disk cost.

A synthetic researcher's dataset (x of 0-16 ids, y of 1-32 ids over a 5,000-id vocabulary, an
int label of 8 classes, 4 groups; optionally ``base_nll``) is written as Parquet (pyarrow's
default snappy) and as JSONL, then registered two ways:

- in process: ``read_table`` -> ``canonicalize`` -> ``DatasetStore.add`` (phase by phase);
- end to end: ``POST /api/v1/datasets`` on a real ``ksweep serve`` (streamed upload, the
  validation subprocess under its memory limit, the commit), Parquet only by default.

Printed: seconds per phase and in all against the one-minute goal, the canonical object's bytes
against the source file's (the registry's disk cost), and the time to open the stored table
memory-mapped and take a first batch of 256 rows as id arrays (what a trial's loader starts
from). ``python -m benchmarks.bench_datasets [--rows N] [--jsonl] [--no-rest] [--base-nll]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from workers.datasets.store import DatasetStore
from workers.datasets.table import canonicalize, read_table

GOAL_S = 60.0
ROOT = Path(__file__).resolve().parents[1]


def _lists(rng: np.random.Generator, rows: int, low: int, high: int, vocab: int) -> pa.Array:
    lengths = rng.integers(low, high + 1, rows)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, vocab, offsets[-1])))


def make_table(rows: int, base_nll: bool, seed: int = 0, poison: bool = False) -> pa.Table:
    """The benchmark's dataset (deterministic for a seed); ``poison``: the last id is -1."""
    rng = np.random.default_rng(seed)
    y = _lists(rng, rows, 1, 32, 5000)
    if poison:
        values = y.values.to_numpy().copy()
        values[-1] = -1
        y = pa.ListArray.from_arrays(y.offsets, pa.array(values))
    columns = {"x": _lists(rng, rows, 0, 16, 5000), "y": y,
               "label": pa.array(rng.integers(0, 8, rows)),
               "group": pa.array(np.array(["a", "b", "c", "d"])[rng.integers(0, 4, rows)])}
    if base_nll:
        values = pa.array(rng.exponential(3.0, len(y.values)).astype(np.float32))
        columns["base_nll"] = pa.ListArray.from_arrays(y.offsets, values)
    return pa.table(columns)


def write_jsonl(table: pa.Table, path: Path, batch: int = 50_000) -> None:
    with path.open("w") as handle:
        for start in range(0, table.num_rows, batch):
            for row in table.slice(start, batch).to_pylist():
                handle.write(json.dumps(row, separators=(",", ":")) + "\n")


def register_in_process(path: Path, root: Path, name: str) -> dict[str, float]:
    """Phase timings of one in-process registration."""
    times: dict[str, float] = {}
    start = time.perf_counter()
    table = read_table(path)
    times["read"] = time.perf_counter() - start
    mark = time.perf_counter()
    canonical = canonicalize(table, path.name)
    times["canonicalize"] = time.perf_counter() - mark
    mark = time.perf_counter()
    record = DatasetStore(root).add(canonical, name=name, owner="bench")
    times["hash+summary+store"] = time.perf_counter() - mark
    times["total"] = time.perf_counter() - start
    times["stored_bytes"] = record.bytes
    return times


def _server_cpu_s(pid: int) -> float:
    """CPU seconds of the server and of its children it has reaped (the validation processes)."""
    import psutil

    return sum(psutil.Process(pid).cpu_times()[:4])


def register_over_rest(path: Path, workdir: Path, hostile: list[tuple[str, Path]]) -> None:
    """``POST /datasets`` with the file streamed on a fresh real server, then the hostile uploads;
    prints wall and server CPU seconds (validation subprocess included) of each."""
    from tests.support.serve_process import ServeProcess

    limit = int(path.stat().st_size * 1.5)
    env = {**os.environ, "KSWEEP_SWEEP_ROOT": str(workdir / "root"),
           "KSWEEP_API_TOKENS": "bench:bench-token", "KSWEEP_MAX_CONCURRENT_SWEEPS": "0",
           "KSWEEP_MAX_DATASET_BYTES": str(limit),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir}/mlflow.db", "PYTHONPATH": str(ROOT)}
    server = ServeProcess(env, workdir / "serve.log", cwd=workdir)
    server.start()
    assert server.process is not None
    pid = server.process.pid

    def post(name: str, body: Path | None, declared: int | None = None) -> tuple[int, float, float]:
        def chunks():
            if body is None:  # declared bytes of junk, or an endless stream cut at limit + 1
                left = declared if declared is not None else float("inf")
                while left > 0:
                    size = int(min(left, 1 << 20))
                    left -= size
                    yield b" " * size
                return
            with body.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    yield chunk

        headers = {"Authorization": "Bearer bench-token",
                   "Content-Type": "application/vnd.apache.parquet"}
        if declared is not None:
            headers["Content-Length"] = str(declared)
        cpu, start = _server_cpu_s(pid), time.perf_counter()
        try:
            status = httpx.post(server.url + "/datasets", params={"name": name},
                                content=chunks(), headers=headers, timeout=600).status_code
        except httpx.HTTPError:  # the server answered 413 and closed while we still sent
            status = 413
        return status, time.perf_counter() - start, _server_cpu_s(pid) - cpu

    try:
        status, wall, cpu = post("bench-rest", path, path.stat().st_size)
        verdict = "met" if wall < GOAL_S and status == 201 else "NOT met"
        print(f"  POST /api/v1/datasets (real server, validation subprocess): HTTP {status} in "
              f"{wall:.1f} s ({cpu:.1f} s server CPU), {wall / GOAL_S:.3f}x of the 60 s goal "
              f"({verdict})")
        print(f"  hostile uploads (KSWEEP_MAX_DATASET_BYTES {limit / 1e6:.0f} MB): "
              "HTTP status, wall, server CPU incl. the validation process")
        cases = [(label, file, file.stat().st_size) for label, file in hostile]
        cases += [("Content-Length over the limit", None, limit + 1),
                  ("endless body, no Content-Length", None, None)]
        for label, file, declared in cases:
            status, wall, cpu = post("hostile", file, declared)
            print(f"    {label:<44s} HTTP {status}  {wall:6.2f} s  {cpu:6.2f} s CPU")
    finally:
        server.stop()


def first_batch_seconds(root: Path, sha256: str, whole: bool, batch: int = 256) -> float:
    """Seconds to a first batch of ids: from the whole table opened, or the first row group."""
    start = time.perf_counter()
    store = DatasetStore(root)
    if whole:
        table = store.open_table(sha256).slice(0, batch)
    else:
        table = pa.Table.from_batches([next(store.parquet_file(sha256).iter_batches(batch))])
    for name in ("y", "x"):
        column = table.column(name).combine_chunks()
        column.values.to_numpy(), column.offsets.to_numpy()
    return time.perf_counter() - start


def validation_peak_mb(path: Path, root: Path) -> float:
    """Peak RSS of ``workers.datasets.check`` on ``path`` (as the service runs it)."""
    import subprocess
    import sys

    from workers.datasets.check import CHILD_ENV

    out = subprocess.run(
        [sys.executable, "-m", "workers.datasets.check", "--input", str(path), "--format",
         "parquet", "--source-name", path.name, "--root", str(root), "--memory-bytes",
         str(4 << 30)], capture_output=True, text=True, env={**os.environ, **CHILD_ENV},
        timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])["max_rss_bytes"] / 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--jsonl", action="store_true", help="Also register the JSONL copy.")
    parser.add_argument("--no-rest", action="store_true", help="Skip the real-server upload.")
    parser.add_argument("--base-nll", action="store_true", help="Add a base_nll column.")
    args = parser.parse_args(argv)
    print(f"\n== Datasets: register {args.rows:,} rows (load {os.getloadavg()[0]:.1f})")
    with tempfile.TemporaryDirectory(prefix="ksweep-bench-data-") as tmp:
        work = Path(tmp)
        source = make_table(args.rows, args.base_nll)
        tokens = len(source.column("y").combine_chunks().values) + len(
            source.column("x").combine_chunks().values)
        pq.write_table(source, work / "source.parquet")
        sources = [work / "source.parquet"]
        if args.jsonl:
            write_jsonl(source, work / "source.jsonl")
            sources.append(work / "source.jsonl")
        del source
        print(f"  {tokens:,} ids in x and y")
        for index, path in enumerate(sources):
            times = register_in_process(path, work / "registry", f"bench-{index}")
            size = path.stat().st_size
            phases = ", ".join(f"{k} {v:.1f} s" for k, v in times.items()
                               if k not in ("total", "stored_bytes"))
            verdict = "met" if times["total"] < GOAL_S else "NOT met"
            print(f"  in process, {path.suffix[1:]:<8s} {times['total']:6.1f} s ({phases})  "
                  f"{times['total'] / GOAL_S:.3f}x of the 60 s goal ({verdict})")
            print(f"    disk: source {size / 1e6:.1f} MB, stored {times['stored_bytes'] / 1e6:.1f} MB"
                  f" = {times['stored_bytes'] / size:.2f}x the source")
        sha = DatasetStore(work / "registry").get("bench-0").sha256
        print(f"  first batch of 256 rows from the stored copy: "
              f"{first_batch_seconds(work / 'registry', sha, False) * 1e3:.1f} ms by row group "
              f"(store.parquet_file), {first_batch_seconds(work / 'registry', sha, True) * 1e3:.0f}"
              " ms after reading the whole table (store.open_table)")
        print(f"  peak RSS of this process: "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB")
        if not args.no_rest:
            poisoned = work / "poisoned.parquet"
            pq.write_table(make_table(args.rows, args.base_nll, poison=True), poisoned)
            bomb = work / "bomb.parquet"
            pq.write_table(pa.table({"y": [[7] * 1000] * 20_000}), bomb, compression="zstd",
                           use_dictionary=False)
            register_over_rest(work / "source.parquet", work / "rest", [
                (f"{args.rows:,} rows, last id negative", poisoned),
                ("compression bomb (refused from the footer)", bomb)])
            for label, path in (("valid", work / "source.parquet"), ("last id negative", poisoned)):
                print(f"  validation process alone on the {label} file: "
                      f"{validation_peak_mb(path, work / 'peak'):.0f} MB peak RSS")


if __name__ == "__main__":
    main()

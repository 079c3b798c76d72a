"""Side-by-side timing helpers: interleaved repeats, medians, ratios."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(
    candidates: dict[str, Callable[[], object]], repeats: int = 30, warmup: int = 3
) -> dict[str, float]:
    """Median seconds of each candidate, running them round-robin so drift hits all alike."""
    for _ in range(warmup):
        for run in candidates.values():
            run()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def print_ratios(title: str, medians: dict[str, float], baseline: str, goal: float | None = None) -> None:
    """Print each candidate's median and its ratio to ``baseline``."""
    print(f"\n== {title}")
    base = medians[baseline]
    for name, seconds in medians.items():
        ratio = seconds / base
        flag = ""
        if goal is not None and name != baseline:
            verdict = "met" if ratio <= goal else "NOT met"
            flag = f"  (goal <= {goal:.2f}x: {verdict})"
        print(f"  {name:<40s} {seconds * 1e3:9.2f} ms   {ratio:6.3f}x{flag}")

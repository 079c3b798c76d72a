"""The API's and the command line's start: ``import service.api.app`` and ``ksweep --help``.

Each is a whole process, timed by its own CPU (user + system, from ``wait4``) and wall; the
budgets are 1 CPU-s for the app's import and 0.5 s of wall for ``--help``. Bytecode is written
and one warm-up run each is not counted, as a deployed service runs from its ``__pycache__``.
``--root`` (given more than once) times another checkout too, alternating run by run, so a
before and an after are measured side by side: ``git archive main | tar -x -C /tmp/base``.
Printed: each command's runs, their medians and least CPU (the least disturbed run on a shared
machine), then the modules over 10 ms in ``-X importtime`` (cumulative) of the last checkout's
app import.

    python -m benchmarks.bench_import [--root PATH ...] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "import service.api.app": ["-c", "import service.api.app"],
    "ksweep --help": ["-m", "ksweep.cli", "--help"],
}
BUDGETS = {"import service.api.app": ("CPU", 1.0), "ksweep --help": ("wall", 0.5)}


def _env(root: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return env | {"PYTHONPATH": str(root)}


def run_once(root: Path, arguments: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``python ARGUMENTS`` run in ``root``."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, *arguments], cwd=root, env=_env(root),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{arguments} in {root} exited {process.returncode}: "
                           f"{process.stderr.read().decode()[-2000:] if process.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime


def slowest_imports(root: Path, threshold_us: int = 10_000) -> list[str]:
    """``-X importtime``'s lines of the app's import over ``threshold_us`` cumulative."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import service.api.app"],
                          cwd=root, env=_env(root), capture_output=True, text=True, check=True)
    lines = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit() and int(parts[1]) >= threshold_us:
            lines.append(f"  {int(parts[1]) / 1000:7.1f} ms  {parts[2].rstrip()}")
    return lines


def main(roots: list[Path] | None = None, runs: int = 3) -> dict[tuple[str, str], float]:
    """Each command's median CPU and wall in each checkout; returns ``{(root, command): CPU}``."""
    roots = roots or [ROOT]
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for root in roots:  # warm-up: writes the bytecode
        for arguments in COMMANDS.values():
            run_once(root, arguments)
    for _ in range(runs):
        for root in roots:
            for name, arguments in COMMANDS.items():
                samples.setdefault((str(root), name), []).append(run_once(root, arguments))
    print(f"\n== the API's and the CLI's start, {runs} runs each (wall / CPU seconds)")
    medians = {}
    for (root, name), values in samples.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        medians[(root, name)] = cpu
        kind, budget = BUDGETS[name]
        met = (cpu if kind == "CPU" else wall) <= budget
        listing = ", ".join(f"{w:.2f}/{c:.2f}" for w, c in values)
        least = min(v[1] for v in values)
        print(f"  {root}: {name:<24s} wall {wall:.2f} s  CPU {cpu:.2f} s, least {least:.2f}  "
              f"(runs {listing}; budget {budget} {kind}-s: {'met' if met else 'NOT met'})")
    print(f"\n  -X importtime of import service.api.app in {roots[-1]}, modules over 10 ms:")
    print("\n".join(slowest_imports(roots[-1])))
    return medians


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, action="append", help="a checkout to time (default: this one)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    main(args.root, args.runs)

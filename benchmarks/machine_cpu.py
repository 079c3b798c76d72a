"""The whole machine's CPU seconds, for measuring work whose processes outlive the one measured
(Ray's outlive a driver): the sweep benchmarks that run whole processes and the suite's
CPU-per-test plugin."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def machine_cpu_seconds() -> float:
    """CPU seconds every process has spent since boot: /proc/stat's first line less idle and
    iowait (Linux)."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def run_measured(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Run ``command`` to its end: (wall seconds, the machine's CPU seconds), a second after
    the exit included (Ray's daemons outlive the driver by a moment). A RuntimeError with the
    command's output tail if it fails."""
    cpu, started = machine_cpu_seconds(), time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    time.sleep(1.0)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n"
                           f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return wall, machine_cpu_seconds() - cpu

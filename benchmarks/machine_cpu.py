"""The whole machine's CPU seconds, for measuring work whose processes outlive the one measured
(Ray's outlive a driver): the writer-process benchmark and the suite's CPU-per-test plugin."""

from __future__ import annotations

import os


def machine_cpu_seconds() -> float:
    """CPU seconds every process has spent since boot: /proc/stat's first line less idle and
    iowait (Linux)."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")

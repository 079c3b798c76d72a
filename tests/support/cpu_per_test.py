"""A pytest plugin that writes each test's CPU seconds, for finding where a CPU-bound suite goes.

``KSWEEP_TEST_CPU_LOG=cpu.tsv pytest -p tests.support.cpu_per_test -n 0 -m slow`` appends one
line per test: the CPU seconds the whole machine spent while it ran (``/proc/stat``: every
process, so its drivers, Ray and services too), its wall seconds, its node id. Run it on an
otherwise idle machine and one test at a time (``-n 0``), or the figures mix. Linux only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from benchmarks.machine_cpu import machine_cpu_seconds

LOG_VAR = "KSWEEP_TEST_CPU_LOG"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get(LOG_VAR)
    cpu, wall = machine_cpu_seconds(), time.monotonic()
    yield
    if path:  # set-up, call and teardown: a session fixture counts for the first test using it
        with open(path, "a") as log:
            log.write(f"{machine_cpu_seconds() - cpu:.1f}\t{time.monotonic() - wall:.1f}\t{item.nodeid}\n")

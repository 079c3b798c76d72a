"""tests/support/cpu_per_test.py: one line per test, with the CPU the machine spent on it."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY = """
import time

def test_busy():
    end = time.process_time() + 0.5
    while time.process_time() < end:
        pass

def test_idle():
    time.sleep(0.3)
"""


def test_each_test_gets_a_line_with_its_cpu_and_wall_seconds(tmp_path):
    (tmp_path / "test_probe.py").write_text(BUSY)
    log = tmp_path / "cpu.tsv"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "tests.support.cpu_per_test", str(tmp_path / "test_probe.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        # Only the plugin under test: the installed ones (schemathesis, hypothesis...) cost seconds.
        env={**os.environ, "PYTHONPATH": str(ROOT), "KSWEEP_TEST_CPU_LOG": str(log),
             "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    assert [row[2] for row in rows] == ["test_probe.py::test_busy", "test_probe.py::test_idle"]
    (busy_cpu, busy_wall, _), (_, idle_wall, _) = rows
    # The busy test spent its 0.5 CPU-s (at least: other processes may add to the machine's).
    assert float(busy_cpu) >= 0.4 and float(busy_wall) >= 0.4
    assert float(idle_wall) >= 0.3

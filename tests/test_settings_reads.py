"""Every ``KSWEEP_*`` variable is read in its package's settings module and nowhere else (the
scripts': ``scripts/script_settings.py``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "sweeps", "workers", "ksweep", "objectives", "scripts")
SETTINGS = ("settings.py", "script_settings.py")
# An environment read whose line names a KSWEEP_ variable or a constant holding one.
READ = re.compile(r"(os\.environ(\.get)?|os\.getenv|environ\.get)\s*[\[(]\s*(\"KSWEEP_|'KSWEEP_|[A-Z_]+_ENV\b)")


def test_no_ksweep_variable_is_read_outside_the_settings_modules():
    reads = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name in SETTINGS:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if READ.search(line):
                    reads.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not reads, "declare these in the package's settings.py and read them there:\n" + "\n".join(reads)


def test_the_scan_finds_a_read(tmp_path):
    assert READ.search('    value = os.environ.get("KSWEEP_X", "1")')
    assert READ.search("    cap = os.environ.get(MEMORY_CAP_ENV, '')")
    assert not READ.search('    address = os.environ.get("RAY_ADDRESS")')

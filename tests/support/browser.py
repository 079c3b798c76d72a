"""Headless Chromium for the tests that look at a served page (the MLflow UI).

Debian's package `chromium` puts its launcher at /usr/bin/chromium and the browser itself at
/usr/lib/chromium/chromium (found there too when /usr/bin is off PATH); Ubuntu's is
chromium-browser. ``.ci/run`` installs Debian's; off CI a test without it skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

DEBIAN_CHROMIUM = Path("/usr/lib/chromium/chromium")
CHROMIUM = (shutil.which("chromium") or shutil.which("chromium-browser")
            or (str(DEBIAN_CHROMIUM) if os.access(DEBIAN_CHROMIUM, os.X_OK) else None))
# Skipped only on a developer machine without Chromium; in CI (CI=true) .ci/run installs it, so
# a missing Chromium there fails the test instead of hiding it.
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="chromium is not installed (apt-get install chromium; .ci/run installs it)")


def chromium(profiles: Path, url: str, *extra: str, budget_ms: int = 60_000) -> str:
    """Load ``url`` in a fresh headless Chromium profile under ``profiles``; its stdout."""
    assert CHROMIUM is not None, "chromium is not installed: .ci/run installs Debian's chromium"
    profile = profiles / f"chromium-profile-{time.monotonic_ns()}"
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", f"--user-data-dir={profile}", "--window-size=2200,1200",
               f"--virtual-time-budget={budget_ms}", *extra, url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    return done.stdout


def dom_with(profiles: Path, url: str, needle: str) -> str:
    """The page's DOM once ``needle`` is rendered (a slow machine needs a longer budget)."""
    dom = ""
    for budget_ms in (60_000, 180_000):
        dom = chromium(profiles, url, "--dump-dom", budget_ms=budget_ms)
        if needle in dom:
            break
    return dom

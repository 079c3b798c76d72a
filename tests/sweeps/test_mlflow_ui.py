"""The MLflow UI over a finished sweep's store: a real `mlflow server`, headless Chromium.

The saved views the driver stores (experiment tags ``mlflow.sharedViewState.<key>``) open
the runs page on the sweep's trial runs with their axes as columns, and on the summary
runs whose line charts draw the test metric against alpha.
"""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_runner import _env, _write_spec

from tests.support.groups import exclusive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), exclusive]  # headless Chromium
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT_COPY = Path("/tmp/ksweep-mlflow-ui.png")  # for a person to look at; not asserted


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_up(url: str, server: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def _chromium(tmp_path: Path, url: str, *extra: str, budget_ms: int = 60_000) -> str:
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", f"--user-data-dir={profile}", "--window-size=2200,1200",
               f"--virtual-time-budget={budget_ms}", *extra, url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    return done.stdout


def _dom_with(tmp_path: Path, url: str, needle: str) -> str:
    """The page's DOM once ``needle`` is rendered (a slow machine needs a longer budget)."""
    dom = ""
    for budget_ms in (60_000, 180_000):
        dom = _chromium(tmp_path, url, "--dump-dom", budget_ms=budget_ms)
        if needle in dom:
            break
    return dom


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_runs_page_shows_the_trials_and_their_axes(tmp_path):
    port = _free_port()
    spec = _write_spec(tmp_path, "ui", {
        "name": "ui", "alpha": [0, 1], "loss_stacks": ["uniform", "raw_token_weighted"],
        "seeds": 1, "template.training.epochs": 1, "template.data.train_size": 128,
        "template.data.val_size": 64,
    })
    env = {**_env(tmp_path), "KSWEEP_MLFLOW_UI_URL": f"http://127.0.0.1:{port}"}
    # Run this test with --basetemp on a machine shared with other pytest sessions: they
    # clean up old /tmp/pytest-of-<user> folders, this one's mlflow.db among them.
    sweep = subprocess.run(
        [sys.executable, "-m", "ksweep.cli", "sweep", "run", str(spec), "--sweep-id", "ui1",
         "--num-cpus", "1"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    report = json.loads((tmp_path / "root" / "ui1" / "report.json").read_text())
    views = report["mlflow_views"]
    assert views["trials"].startswith(f"http://127.0.0.1:{port}/#/experiments/")
    assert views["trials"].endswith("?viewStateShareKey=ksweep-ui1-trials")
    assert views["summary"].endswith("?viewStateShareKey=ksweep-ui1&compareRunsMode=CHART")
    # Job execution (GenAI scorer jobs) would start eight more processes, unused here.
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
         f"sqlite:///{tmp_path}/mlflow.db", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], cwd=tmp_path, env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_until_up(f"http://127.0.0.1:{port}/health", server)
        dom = _dom_with(tmp_path, views["trials"], "discrete-raw_token_weighted-a1-s0")
        assert "viewing a shared view" in dom
        # Two trials: uniform at alpha 0 (standing in three rows) and R_tok at alpha 1.
        assert "discrete-uniform-a0-s0" in dom and "discrete-raw_token_weighted-a1-s0" in dom
        assert "loss_stack" in dom and "alpha" in dom
        assert ">1.0<" in dom and ">0.0<" in dom  # their alpha params
        assert "uniform@alpha=1" in dom  # the shared_by column
        assert "summary-discrete-uniform" not in dom  # the view lists trial runs only
        shot = tmp_path / "summary.png"
        _chromium(tmp_path, views["summary"], f"--screenshot={shot}")
        assert shot.exists() and shot.stat().st_size > 10_000
        shutil.copy(shot, SCREENSHOT_COPY)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()

"""``ksweep sweep run`` starts its own local Ray (GCS, raylet, workers, agents): every socket
that process tree listens on is on loopback, and no idle worker is prestarted (``LOCAL_RAY_ENV``
of service.orchestrator.driver_env, set by the CLI before Ray is imported)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from test_ray_faults import _sweep, _title, _write_spec

from tests.support.sockets import listening, loopback

pytestmark = pytest.mark.slow


def test_the_cli_local_ray_listens_on_loopback_only(tmp_path: Path):
    # Long enough (tens of seconds) that Ray's daemons are all up while they are listed.
    spec = _write_spec(tmp_path, "binding", {"template.training.epochs": 40, "alpha": [0],
                                             "loss_stacks": ["uniform"], "seeds": 1})
    driver = _sweep(tmp_path, spec, "bind1")
    sockets: dict[tuple[str, int], str] = {}
    workers: list[str] = []  # Ray's workers at the last look (a worker is IDLE until it gets work)
    try:
        for polls in range(240):  # Ray's daemons come up one by one; gather what listens a while
            if driver.poll() is not None:
                break
            tree = [psutil.Process(driver.pid), *psutil.Process(driver.pid).children(recursive=True)]
            sockets |= listening(tree)
            workers = sorted(t.split()[0] for t in map(_title, tree) if t.startswith("ray::"))
            names = set(sockets.values())
            if (polls >= 30 and any("raylet" in n for n in names) and any("gcs" in n for n in names)
                    and any("ImplicitFunc" in w for w in workers)):  # the trial's actor trains
                break
            time.sleep(0.5)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the Ray it started
        output = driver.communicate(timeout=60)[0]
    names = set(sockets.values())
    assert any("raylet" in n for n in names) and any("gcs" in n for n in names), (names, output[-3000:])
    wide = {addr: name for addr, name in sockets.items() if not loopback(addr[0])}
    assert not wide, f"listening beyond loopback: {wide}"
    # While the trial trains, its actor is Ray's only worker: none was prestarted to idle.
    assert any("ImplicitFunc" in w for w in workers), (workers, output[-3000:])
    assert not any(w.startswith("ray::IDLE") for w in workers), workers
    print(f"{len(sockets)} listening sockets, all on loopback: {sorted(names)}")

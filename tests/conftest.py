"""Suite-wide set-up for parallel runs (pytest-xdist, ``make test``: docs/development.md).

Torch runs on one thread (``OMP_NUM_THREADS=1``, unless set), in the tests and in every
process they start. Each pytest process (an xdist worker, or the lone process of a plain
``pytest``) gets its own Ray temp folder through ``RAY_TMPDIR``: every local Ray a test starts
(in-process or in a driver, service or cluster child, which inherit the environment) keeps its sockets, logs and
``session_latest`` link there, so two workers' Rays never share a session folder.
Tests that must not overlap with others of their kind, or that share a costly session fixture,
carry an ``xdist_group`` (:mod:`tests.support.groups`).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from workers.imports import heavy_imports

_ray_tmp: str | None = None


def pytest_configure(config) -> None:
    global _ray_tmp
    # Torch in the test processes and their children on one thread, as Ray gives each trial
    # actor: three workers share two cores, and idle OpenMP threads spin on the CPU they need.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    # Short, under /tmp: Ray's Unix socket paths must stay under 107 bytes.
    _ray_tmp = tempfile.mkdtemp(prefix=f"kr-{worker}-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = _ray_tmp


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    # Collection imports every test module, so torch, Ray, MLflow...: the collector's passes over
    # that heap are most of a worker's collection CPU (docs/development.md).
    with heavy_imports():
        return (yield)


def pytest_unconfigure(config) -> None:
    if _ray_tmp is not None:
        shutil.rmtree(_ray_tmp, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Give grouped tests their ``@group`` node-id suffix where pytest-xdist could not.

    ``--dist loadgroup`` groups tests by that suffix, which the worker adds by writing
    ``item._nodeid``; pytest 9.2 keeps node ids in ``item._id``, so the write is lost and the
    group's tests are spread over all workers (pytest-xdist issue 1386). Where the suffix is
    already there (older pytest, or a fixed xdist) this does nothing.
    """
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers of loadgroup
        return
    # Longest first (the exclusive group, then the slow tests), so the long tests do not start
    # last and leave the other workers idle at the end; the sort is stable, so every worker
    # collects the same order.
    items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None,
                                 item.get_closest_marker("slow") is None))
    from _pytest.nodeid import NodeId  # pytest >= 9.2 only, where the suffix goes missing

    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)

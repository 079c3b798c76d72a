"""Cohorts bigger than the device's free memory train in memory-sized chunks (workers/cohort/memory.py)."""

import logging

import pytest
import torch

from tests.workers.test_cohort import base_config, members
from workers.cohort.chunked import ChunkedCohort, open_cohort, run_cohort
from workers.cohort.memory import (
    HEADROOM,
    chunk_sizes,
    free_bytes,
    member_step_bytes,
    plan_chunks,
)
from workers.cohort.trainer import Cohort
from workers.settings import MEMORY_CAP_ENV


def test_chunk_sizes_split_evenly_within_the_budget():
    assert chunk_sizes(10, 100, 500) == [4, 3, 3]  # 0.8 x 500 = 400 bytes: 4 members a chunk
    assert chunk_sizes(1024, 1, 10**9) == [1024]
    assert chunk_sizes(7, 100, None) == [7]  # no device limit (the CPU): one chunk
    assert chunk_sizes(3, 10**6, 10) == [1, 1, 1]  # not even one fits: one at a time
    with pytest.raises(ValueError, match="at least one member"):
        chunk_sizes(0, 100, 500)


def test_a_cohort_over_the_budget_trains_in_chunks_with_the_same_numbers(tmp_path, caplog):
    configs = members(base_config("discrete"))[:3]
    whole = Cohort.create(configs, tmp_path).run()
    trainers = [m.trainer for m in Cohort.create_members(configs, tmp_path)]
    per_member = member_step_bytes(trainers[0])
    assert per_member > sum(p.numel() for p in trainers[0].model.parameters()) * 4 * 4  # params, grads, AdamW
    assert free_bytes(torch.device("cpu")) is None and plan_chunks(trainers) == [[0, 1, 2]]
    budget = int(2 * per_member / HEADROOM) + 1  # room for two members
    with caplog.at_level(logging.WARNING, logger="workers.cohort.memory"):
        chunked = run_cohort(configs, tmp_path, free=budget)
    assert "cohort of 3 members" in caplog.text and "in 2 chunks of at most 2" in caplog.text
    assert [m.position for m in chunked] == [0, 1, 2]
    for a, b in zip(whole, chunked, strict=True):
        assert b.status == "finished"
        assert b.step_losses == pytest.approx(a.step_losses, rel=1e-6, abs=1e-7)
        assert b.trainer.history["val/loss"] == pytest.approx(a.trainer.history["val/loss"], rel=1e-6)


def test_the_memory_cap_limits_what_a_cohort_plans_for(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv(MEMORY_CAP_ENV, "2.5")
    assert free_bytes(cpu) == int(2.5 * 2**20)  # a limit on the CPU too, where there is none
    for bad in ("lots", "0", "-1", "inf", "nan"):
        monkeypatch.setenv(MEMORY_CAP_ENV, bad)
        with pytest.raises(ValueError, match=f"{MEMORY_CAP_ENV} must be a positive number of MiB"):
            free_bytes(cpu)
    monkeypatch.setenv(MEMORY_CAP_ENV, " ")
    assert free_bytes(cpu) is None


def test_a_chunked_cohort_runs_epoch_by_epoch_with_the_whole_cohorts_numbers(tmp_path):
    # The sweep's path: every epoch, each chunk in turn (a Tune report per epoch for all members).
    configs = members(base_config("discrete"))[:3]
    whole = Cohort.create(configs, tmp_path)
    assert isinstance(open_cohort(configs, tmp_path), Cohort)  # the CPU: one chunk
    per_member = member_step_bytes(whole.members[0].trainer)
    chunked = open_cohort(configs, tmp_path, free=int(2 * per_member / HEADROOM) + 1)
    assert isinstance(chunked, ChunkedCohort)
    assert [[m.position for m in c.members] for c in chunked.chunks] == [[0, 1], [2]]
    assert [m.position for m in chunked.members] == [0, 1, 2]
    while whole.active:
        expected, got = whole.run_epoch(), chunked.run_epoch()
        assert got.keys() == expected.keys() and chunked.epoch == whole.epoch
        for position, metrics in expected.items():
            assert got[position]["val/loss"] == pytest.approx(metrics["val/loss"], rel=1e-6)
    assert not chunked.active
    for a, b in zip(whole.members, chunked.members, strict=True):
        assert b.status == a.status == "finished"
        assert b.step_losses == pytest.approx(a.step_losses, rel=1e-6, abs=1e-7)
    # A member of the second chunk saves the checkpoint a lone trainer resumes from.
    path = chunked.save_checkpoint(chunked.members[2], tmp_path / "m2.pt")
    assert path.exists() and torch.load(path, weights_only=False)["epoch"] == whole.epoch

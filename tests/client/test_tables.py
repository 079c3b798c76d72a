"""The frames builder and the history endpoint's metric parsing on hand-made inputs (fast)."""

from __future__ import annotations

import math

import pytest

from ksweep.tables import build_frames
from service.api.errors import ProblemError
from service.api.routes.history import parse_metrics
from service.api.schemas import Report


def _report() -> Report:
    cell = {"alpha": 1.0, "loss_stack": "raw_token_weighted", "model": "discrete", "beta": None,
            "free_bits": None, "beta_effective": 1.0, "kind": "all", "metric": "latent_nmi",
            "split": "test", "mean": 0.5, "ci_low": 0.25, "ci_high": 0.75, "n": 2, "n_nan": 0,
            "seeds": [0, 1], "values": [0.4, 0.6], "shared_with": [], "extra_key": "kept"}
    trials = [{"trial_id": "t2", "alpha": 1.0, "loss_stack": "raw_token_weighted",
               "model": "discrete", "seed": 0, "state": "done", "epochs": 2,
               "error": None, "mlflow_run_id": "r2"},
              {"trial_id": "t1", "alpha": 0.0, "loss_stack": "uniform", "model": "discrete",
               "seed": 0, "state": "failed", "epochs": 0, "error": "boom",
               "mlflow_run_id": None}]
    return Report.model_validate({
        "sweep_id": "s", "name": "n", "objective": {}, "analysis": {"metric": "latent_nmi"},
        "split": "test", "readout_source": "selected", "cells": [cell], "contrasts": [],
        "trials": trials})


def test_frames_keep_every_trial_and_key():
    runs = [{"trial_id": "t2", "run_id": "r2", "shared_by": ["a", "b"],
             "final": {"test/latent_nmi": 0.6, "selected/epoch": 2.0, "val/loss": None}},
            {"trial_id": "ghost", "run_id": "rx", "shared_by": [], "final": {"x": 1.0}}]
    points = [{"trial_id": "t2", "metric": "val/loss", "step": 1, "value": 3.0},
              {"trial_id": "t2", "metric": "val/loss", "step": 2, "value": None},
              {"trial_id": "ghost", "metric": "val/loss", "step": 1, "value": 9.0}]
    frames = build_frames(_report(), runs, points)
    trials = frames.trials
    assert list(trials["trial_id"]) == ["t1", "t2"]  # sorted; the failed trial keeps its row
    t1, t2 = trials.iloc[0], trials.iloc[1]
    assert t1["state"] == "failed" and t1["error"] == "boom" and math.isnan(t1["test/latent_nmi"])
    assert t2["shared_by"] == "a,b" and t2["selected_epoch"] == 2 and t2["test/latent_nmi"] == 0.6
    assert math.isnan(t2["val/loss"]) and "x" in trials  # the ghost run's metric, no ghost row
    assert list(trials.columns[:6]) == ["trial_id", "alpha", "loss_stack", "model", "seed", "state"]
    assert frames.cells.loc[0, "extra_key"] == "kept" and frames.cells.loc[0, "values"] == [0.4, 0.6]
    history = frames.history
    assert list(history.columns) == ["trial_id", "alpha", "loss_stack", "model", "seed", "epoch",
                                     "metric", "value"]
    assert len(history) == 2 and math.isnan(history["value"].iloc[1])
    assert frames.table("cells") is frames.cells
    with pytest.raises(ValueError, match="use trials, cells"):
        frames.table("runs")


def test_empty_history_has_its_columns():
    frames = build_frames(_report(), [], [])
    assert list(frames.history.columns) == ["trial_id", "epoch", "metric", "value"]
    assert frames.contrasts.empty


def test_metrics_parsing_names_the_field():
    assert parse_metrics(None) == ["val/latent_nmi", "val/latent_ari", "val/loss", "val/kl",
                                   "val/kappa_mean"]
    assert parse_metrics(["val/loss,val/kl", "val/loss"]) == ["val/loss", "val/kl"]
    with pytest.raises(ProblemError) as bad:
        parse_metrics(["val/latent nmi"])
    assert bad.value.problem.errors[0].field == "metrics"
    with pytest.raises(ProblemError, match="at most 50"):
        parse_metrics([",".join(f"m{i}" for i in range(51))])

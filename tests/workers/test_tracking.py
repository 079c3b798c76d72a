"""Tests for MLflow logging (workers/tracking/runs.py) and the figures it logs (workers/plots.py).

One real SQLite store serves the whole module: the first use of a fresh store runs the
schema migrations, which take seconds. Tests keep apart by using their own experiments.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

from tests.support.mlflow_store import sqlite_store_uri
from workers.contract import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, default_tracking_uri
from workers.plots import (
    plot_kappa_histogram,
    plot_metric_against_alpha,
    plot_reconstruction_curves,
)
from workers.tracking.params import flatten_config
from workers.tracking.reads import find_runs, metric_history
from workers.tracking.runs import RunLogger, ensure_experiment

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = sqlite_store_uri(root)
    client = MlflowClient(tracking_uri=uri)
    return {"uri": uri, "client": client, "artifacts": (root / "artifacts").as_uri()}


@pytest.fixture
def experiment(store):
    """A fresh experiment name, created with its artifacts under the store's folder."""
    name = f"exp-{uuid.uuid4().hex[:8]}"
    ensure_experiment(store["client"], name, artifact_location=f"{store['artifacts']}/{name}")
    return name


def _start(store, experiment, **kwargs) -> RunLogger:
    return RunLogger.start(store["uri"], experiment, "trial-0", {"ksweep.sweep_id": "s1"}, **kwargs)


class TestDefaultTrackingUri:
    def test_environment_wins(self, monkeypatch):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
        assert default_tracking_uri() == "http://mlflow:5000"

    def test_falls_back_to_absolute_sqlite_file(self, monkeypatch, tmp_path):
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        monkeypatch.chdir(tmp_path)
        assert default_tracking_uri() == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"


class TestFlattenConfig:
    def test_nested_lists_and_none(self):
        config = {
            "alpha": 0.5,
            "model": {"name": "cvae", "latent": {"dim": 8, "kind": "gaussian"}},
            "loss_stack": {"terms": ["ncc", "kl"]},
            "c_base": None,
            "flag": True,
        }
        assert flatten_config(config) == {
            "alpha": "0.5",
            "model.name": "cvae",
            "model.latent.dim": "8",
            "model.latent.kind": "gaussian",
            "loss_stack.terms": '["ncc", "kl"]',
            "c_base": "None",
            "flag": "True",
        }

    def test_prefix_and_empty_mapping(self):
        assert flatten_config({"a": {}, "b": 1}, prefix="trial") == {"trial.b": "1"}
        assert flatten_config({}) == {}

    def test_long_values_are_truncated_to_mlflow_limit(self):
        flat = flatten_config(
            {"long": "x" * (MAX_PARAM_VAL_LENGTH + 10), "items": list(range(5000))}
        )
        assert len(flat["long"]) == MAX_PARAM_VAL_LENGTH
        assert len(flat["items"]) == MAX_PARAM_VAL_LENGTH

    def test_lists_of_unencodable_items_fall_back_to_str(self):
        assert flatten_config({"paths": [Path("a")]}) == {"paths": '["a"]'}


class TestEnsureExperiment:
    def test_creates_with_kind_tag_and_is_idempotent(self, store):
        client = store["client"]
        name = f"new-{uuid.uuid4().hex[:8]}"
        experiment_id = ensure_experiment(client, name)
        assert ensure_experiment(client, name) == experiment_id
        assert client.get_experiment(experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND

    def test_adds_missing_tag_to_existing_experiment(self, store):
        client = store["client"]
        name = f"old-{uuid.uuid4().hex[:8]}"
        experiment_id = client.create_experiment(name)
        assert EXPERIMENT_KIND_TAG not in client.get_experiment(experiment_id).tags
        assert ensure_experiment(client, name) == experiment_id
        assert client.get_experiment(experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND

    def test_losing_the_creation_race_returns_the_winner(self, store):
        client = store["client"]
        name = f"race-{uuid.uuid4().hex[:8]}"

        class LateClient:
            """Sees no experiment, then finds that another process just created it."""

            def __init__(self):
                self.lookups = 0

            def get_experiment_by_name(self, experiment_name):
                self.lookups += 1
                if self.lookups == 1:
                    client.create_experiment(experiment_name)  # the other process wins
                    return None
                return client.get_experiment_by_name(experiment_name)

            def __getattr__(self, attribute):
                return getattr(client, attribute)

        experiment_id = ensure_experiment(LateClient(), name)
        assert experiment_id == client.get_experiment_by_name(name).experiment_id
        assert client.get_experiment(experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND

    def test_deleted_experiment_raises(self, store):
        client = store["client"]
        name = f"gone-{uuid.uuid4().hex[:8]}"
        client.delete_experiment(ensure_experiment(client, name))
        with pytest.raises(ValueError, match="deleted"):
            ensure_experiment(client, name)


class TestRunLogger:
    def test_start_sets_tags_name_and_parent(self, store, experiment):
        parent = _start(store, experiment)
        child = RunLogger.start(
            store["uri"], experiment, "trial-1", {"ksweep.sweep_id": "s1"}, parent.run_id
        )
        run = store["client"].get_run(child.run_id)
        assert run.info.run_name == "trial-1"
        assert run.info.status == "RUNNING"
        assert run.data.tags["mlflow.parentRunId"] == parent.run_id
        assert run.data.tags["ksweep.sweep_id"] == "s1"
        assert "mlflow.parentRunId" not in store["client"].get_run(parent.run_id).data.tags
        assert child.experiment_id == parent.experiment_id == run.info.experiment_id

    def test_params_round_trip_and_relogging(self, store, experiment):
        logger = _start(store, experiment)
        config = {"alpha": 2.0, "seed": 1, "model": {"name": "cvae", "latent_dim": 4}}
        config.update({f"extra_{i}": i for i in range(150)})  # more than one batch of 100
        logger.log_params(config)
        params = store["client"].get_run(logger.run_id).data.params
        assert params == flatten_config(config)

        logger.log_params(config)  # a resumed trial re-logs its config: fine
        logger.log_params({"alpha": 2.0, "epochs": 3})  # same value plus a new param
        assert store["client"].get_run(logger.run_id).data.params["epochs"] == "3"

        with pytest.raises(ValueError, match=r"model\.latent_dim"):
            logger.log_params({"model": {"latent_dim": 8}, "brand_new": 1})
        assert "brand_new" not in store["client"].get_run(logger.run_id).data.params

    def test_metrics_history_over_steps(self, store, experiment):
        logger = _start(store, experiment)
        for epoch in range(3):
            logger.log_metrics(
                {
                    "train/loss": 3.0 - epoch,
                    "val/kl": torch.tensor(0.5 * epoch),
                    "val/latent_nmi": math.nan,
                },
                step=epoch,
            )
        client = store["client"]
        for key in ("train/loss", "val/kl", "val/latent_nmi"):
            assert len(client.get_metric_history(logger.run_id, key)) == 3
        assert metric_history(client, logger.run_id, "train/loss") == [(0, 3.0), (1, 2.0), (2, 1.0)]
        nan_history = metric_history(client, logger.run_id, "val/latent_nmi")
        assert [step for step, _ in nan_history] == [0, 1, 2]
        assert all(math.isnan(value) for _, value in nan_history)
        assert metric_history(client, logger.run_id, "never/logged") == []

    def test_log_metrics_makes_one_batch_call(self, store, experiment, monkeypatch):
        logger = _start(store, experiment)
        calls = []
        original = logger.client.log_batch

        def counting_log_batch(run_id, **kwargs):
            calls.append(len(kwargs.get("metrics", ())))
            return original(run_id, **kwargs)

        monkeypatch.setattr(logger.client, "log_batch", counting_log_batch)
        logger.log_metrics({f"m{i}": float(i) for i in range(40)}, step=0)
        assert calls == [40]

    def test_artifacts_png_and_json(self, store, experiment, tmp_path):
        logger = _start(store, experiment)
        figure = plot_kappa_histogram(
            np.linspace(1.0, 3.0, 100), alpha=1.0, path=tmp_path / "kappa.png"
        )
        logger.log_png(figure)
        logger.log_dict_json({"best": {"alpha": 1.0, "value": math.nan}}, "report.json")
        text = tmp_path / "notes.txt"
        text.write_text("hello")
        logger.log_artifact(text, artifact_path="misc")

        client = store["client"]
        assert [f.path for f in client.list_artifacts(logger.run_id, "plots")] == [
            "plots/kappa.png"
        ]
        top_level = {f.path for f in client.list_artifacts(logger.run_id)}
        assert {"plots", "report.json", "misc"} <= top_level
        report = client.download_artifacts(logger.run_id, "report.json", str(tmp_path))
        assert json.loads(Path(report).read_text()) == {"best": {"alpha": 1.0, "value": None}}

    def test_set_tags_and_finish(self, store, experiment):
        logger = _start(store, experiment)
        logger.set_tags({"ksweep.state": "done", "best_epoch": 4})
        logger.finish("KILLED")
        run = store["client"].get_run(logger.run_id)
        assert run.data.tags["ksweep.state"] == "done"
        assert run.data.tags["best_epoch"] == "4"
        assert run.info.status == "KILLED"
        assert run.info.end_time is not None
        with pytest.raises(ValueError, match="status"):
            logger.finish("DONE")

    def test_context_manager_marks_failure(self, store, experiment):
        with pytest.raises(RuntimeError), _start(store, experiment) as logger:
            raise RuntimeError("diverged")
        assert store["client"].get_run(logger.run_id).info.status == "FAILED"

    def test_attach_continues_the_same_run(self, store, experiment):
        first = _start(store, experiment)
        first.log_params({"alpha": 0.5})
        first.log_metrics({"train/loss": 1.0}, step=0)
        first.finish("FAILED")  # the trial was interrupted

        resumed = RunLogger.attach(store["uri"], first.run_id)
        assert (resumed.run_id, resumed.experiment_id) == (first.run_id, first.experiment_id)
        assert store["client"].get_run(first.run_id).info.status == "RUNNING"
        resumed.log_params({"alpha": 0.5})
        resumed.log_metrics({"train/loss": 0.8}, step=1)
        resumed.finish("FINISHED")
        client = store["client"]
        assert metric_history(client, first.run_id, "train/loss") == [(0, 1.0), (1, 0.8)]
        assert client.get_run(first.run_id).info.status == "FINISHED"

    def test_last_step_is_the_highest_step_of_any_metric(self, store, experiment):
        logger = _start(store, experiment)
        assert logger.last_step() == 0
        logger.log_metrics({"train/loss": 1.0, "val/loss": 2.0}, step=1)
        logger.log_metrics({"val/loss": 1.5}, step=3)
        logger.log_metrics({"train/loss": 0.5}, step=2)
        assert RunLogger.attach(store["uri"], logger.run_id).last_step() == 3

    def test_ui_url(self, store, experiment):
        logger = _start(store, experiment)
        expected = (
            f"http://localhost:5000/#/experiments/{logger.experiment_id}/runs/{logger.run_id}"
        )
        assert logger.ui_url("http://localhost:5000/") == expected
        assert logger.ui_url("http://localhost:5000") == expected


class TestFindRuns:
    def test_returns_every_page_with_filter(self, store, experiment, monkeypatch):
        loggers = [_start(store, experiment) for _ in range(5)]
        loggers[0].set_tags({"role": "parent"})

        original = MlflowClient.search_runs

        def small_pages(self, experiment_ids, filter_string="", page_token=None, **kwargs):
            return original(
                self, experiment_ids, filter_string, max_results=2, page_token=page_token
            )

        monkeypatch.setattr(MlflowClient, "search_runs", small_pages)
        runs = find_runs(store["uri"], experiment, "")
        assert sorted(r.info.run_id for r in runs) == sorted(lg.run_id for lg in loggers)
        parents = find_runs(store["uri"], experiment, "tags.role = 'parent'")
        assert [r.info.run_id for r in parents] == [loggers[0].run_id]

    def test_missing_experiment_gives_no_runs(self, store):
        assert find_runs(store["uri"], "no-such-experiment", "") == []


def _assert_png(path: Path) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 1024


class TestPlots:
    @pytest.mark.parametrize(
        "values",
        [
            torch.distributions.Gamma(2.0, 1.0).sample((500,)) + 1.0,
            np.array([]),
            np.full(20, 1.0),
            np.array([1.0, math.nan, math.inf, 2.0]),
        ],
        ids=["gamma", "empty", "constant", "non-finite"],
    )
    def test_kappa_histogram(self, tmp_path, values):
        path = plot_kappa_histogram(values, alpha=2.0, path=tmp_path / "sub" / "kappa.png")
        assert path == tmp_path / "sub" / "kappa.png"
        _assert_png(path)

    def test_reconstruction_curves(self, tmp_path):
        history = {
            "train/recon_uniform": [3.0, 2.5, 2.2],
            "val/recon_uniform": [math.nan, 2.6, math.nan],
            "train/recon_ncc": [1.0, 0.8, 0.7],
            "train/loss": [4.0, 3.2, 2.9],
            "val/kl": [0.1, 0.2, 0.25],
            "unrelated": [1.0, 2.0, 3.0],
        }
        _assert_png(plot_reconstruction_curves(history, tmp_path / "curves.png", title="trial 0"))

    def test_reconstruction_curves_empty_history(self, tmp_path):
        _assert_png(plot_reconstruction_curves({}, tmp_path / "empty.png"))
        _assert_png(plot_reconstruction_curves({"train/loss": []}, tmp_path / "empty2.png"))

    def test_metric_against_alpha(self, tmp_path):
        rows = [
            {
                "alpha": alpha,
                "loss_stack": stack,
                "val/recon_uniform_mean": 2.0 - 0.1 * alpha + offset,
                "val/recon_uniform_ci95": ci,
            }
            for stack, offset in (("ncc", 0.0), ("uniform", 0.3))
            for alpha, ci in ((0.0, 0.05), (2.0, math.nan), (1.0, 0.1))
        ]
        rows.append({"alpha": 4.0, "loss_stack": "ncc", "val/recon_uniform_mean": math.nan})
        path = plot_metric_against_alpha(rows, "val/recon_uniform", tmp_path / "alpha.png")
        _assert_png(path)

    def test_metric_against_alpha_no_rows(self, tmp_path):
        _assert_png(
            plot_metric_against_alpha([], "val/kl", tmp_path / "none.png", group_key="model")
        )


def test_provenance_is_read_once_per_process(monkeypatch):
    """A reused Ray actor's trials do not run git again; each caller gets its own copy."""
    from workers.tracking import params

    first = params.provenance_params()
    monkeypatch.setattr(params, "_git", lambda *args: pytest.fail(f"git {args} run again"))
    second = params.provenance_params()
    assert second == first and set(first) >= {"provenance.git_commit", "provenance.git_dirty"}
    second["provenance.git_commit"] = "changed by the caller"
    assert params.provenance_params() == first


def test_a_kappa_histogram_this_process_drew_is_written_again_not_drawn(tmp_path, monkeypatch):
    from workers import plots

    values = np.random.default_rng(20261204).gamma(2.0, 1.0, 300)  # values no other test draws
    drawn = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda *args, **kwargs: drawn.append(1) or save(*args, **kwargs))
    first = plot_kappa_histogram(values, 1.5, tmp_path / "a.png", title="kappa on val")
    again = plot_kappa_histogram(values.copy(), 1.5, tmp_path / "sub" / "b.png", title="kappa on val")
    assert len(drawn) == 1 and again.read_bytes() == first.read_bytes()
    plot_kappa_histogram(values, 2.0, tmp_path / "c.png", title="kappa on val")  # another alpha
    plot_kappa_histogram(values[:-1], 1.5, tmp_path / "d.png", title="kappa on val")  # other data
    plot_kappa_histogram(values, 1.5, tmp_path / "e.png", title="kappa on test")  # another title
    assert len(drawn) == 4
    plots._HISTOGRAMS.clear()  # drawn afresh: the same bytes as the copy
    assert plot_kappa_histogram(values, 1.5, tmp_path / "f.png", title="kappa on val").read_bytes() \
        == again.read_bytes()
    assert len(drawn) == 5

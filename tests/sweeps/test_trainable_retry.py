"""A trial started afresh deletes a leftover run of itself before opening its own; those MLflow
calls go through the retry layer, so a server outage at that moment costs no trial: the search
refused once, the delete written but its reply lost, and still exactly one run is deleted."""

from __future__ import annotations

from types import SimpleNamespace

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR
from mlflow.tracking import MlflowClient

import sweeps.tune.member_runs as member_runs
import workers.trial
from sweeps.tune.trial_context import TrialContext
from tests.support.mlflow_store import sqlite_store_uri
from workers.contract import SWEEP_ID_TAG, TRIAL_ID_TAG
from workers.tracking.runs import ensure_experiment


class OutageClient:
    """A real client whose first ``search_runs`` is refused and whose first ``delete_run`` is
    written by the server but its reply lost."""

    def __init__(self, client: MlflowClient) -> None:
        self.client, self.calls = client, []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def search_runs(self, *args, **kwargs):
        self.calls.append("search")
        if self.calls.count("search") == 1:
            raise MlflowException("API request failed: connection refused", INTERNAL_ERROR)
        return self.client.search_runs(*args, **kwargs)

    def delete_run(self, run_id):
        self.calls.append("delete")
        self.client.delete_run(run_id)
        if self.calls.count("delete") == 1:
            raise MlflowException("API request failed: connection reset", INTERNAL_ERROR)


def test_leftover_run_is_deleted_through_an_outage(tmp_path, monkeypatch):
    uri = sqlite_store_uri(tmp_path)
    real = MlflowClient(tracking_uri=uri)
    experiment_id = ensure_experiment(real, "retry-trainable")
    leftover = real.create_run(experiment_id, tags={SWEEP_ID_TAG: "s1", TRIAL_ID_TAG: "t1"})
    faulty = OutageClient(real)
    monkeypatch.setattr(member_runs, "MlflowClient", lambda tracking_uri: faulty)
    # Only the cleanup is under test: making the new run (TrialRunner.new_run) is recorded instead.
    opened = []
    monkeypatch.setattr(workers.trial, "TrialRunner", SimpleNamespace(  # imported where a trial runs
        new_run=lambda *args: opened.append(args[4]) or SimpleNamespace(create=lambda: ("id", "0"))))
    trainer = SimpleNamespace(config=SimpleNamespace(name="t1"))
    context = TrialContext(tracking_uri=uri, experiment_name="retry-trainable", sweep_id="s1",
                           parent_run_id=None, cache_root=str(tmp_path), metric="val/loss",
                           mode="min")

    runs = member_runs.MemberRuns(context)  # a fresh start: the leftover goes, then the new run
    runs.delete_leftovers({TRIAL_ID_TAG: "t1"}, {"t1"})
    assert runs.new_run(trainer, {"alpha": 0.5}, "t1").create() == ("id", "0")

    assert faulty.calls == ["search", "search", "delete"]  # the lost delete was not sent again
    assert real.get_run(leftover.info.run_id).info.lifecycle_stage == "deleted"
    assert opened[0][TRIAL_ID_TAG] == "t1"

"""The driver's backstop close of a finished trial's MLflow runs, against a real sqlite store."""

import json
from types import SimpleNamespace

from mlflow.tracking import MlflowClient

from sweeps.tune.cohort_results import COHORT_MEMBERS_KEY
from sweeps.tune.progress_callback import ProgressCallback
from sweeps.tune.search_space import MEMBERS
from tests.support.mlflow_store import sqlite_store_uri
from workers.contract import STOPPED_EARLY_TAG

EPOCHS = 2


def _runs(client: MlflowClient, experiment_id: str, count: int) -> list[str]:
    return [client.create_run(experiment_id).info.run_id for _ in range(count)]


def test_a_cohorts_runs_still_running_are_closed_and_the_closed_ones_left_alone(tmp_path):
    uri = sqlite_store_uri(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("close")
    # 230 members: three of the 100-run queries, the last one partial.
    run_ids = _runs(client, experiment_id, 230)
    closed_by_the_cohort = set(run_ids[::3])
    for run_id in closed_by_the_cohort:
        client.set_terminated(run_id, "FINISHED")
    # Members of an index divisible by 5 ended before the budget (early stopping).
    epochs = {run_id: 1 if k % 5 == 0 else EPOCHS for k, run_id in enumerate(run_ids)}
    records = [{"trial_id": f"m{k}", "run_id": run_id, "epochs": epochs[run_id], "state": "done"}
               for k, run_id in enumerate(run_ids)]
    trial = SimpleNamespace(trial_id="cohort", config={MEMBERS: [{"alpha": 1.0}] * len(run_ids)},
                            last_result={COHORT_MEMBERS_KEY: json.dumps(records)})

    callback = ProgressCallback("sweep", EPOCHS, "val/loss", "min", uri)
    callback._close_run(trial, "FINISHED")

    for run_id in run_ids:
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED", run_id
        tagged = run.data.tags.get(STOPPED_EARLY_TAG) == "true"
        # Only a run the backstop closed gets the tag, and only when it ended early.
        assert tagged == (run_id not in closed_by_the_cohort and epochs[run_id] < EPOCHS), run_id
        if run_id in closed_by_the_cohort:
            assert run.info.end_time is not None


def test_a_lone_trials_run_is_closed_with_the_status_given_and_a_missing_run_is_skipped(tmp_path):
    uri = sqlite_store_uri(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    (run_id,) = _runs(client, client.create_experiment("close"), 1)
    callback = ProgressCallback("sweep", EPOCHS, "val/loss", "min", uri)

    callback._close_run(SimpleNamespace(trial_id="t", config={"alpha": 1.0},
                                        last_result={"mlflow_run_id": run_id,
                                                     "training_iteration": EPOCHS}), "FAILED")
    assert client.get_run(run_id).info.status == "FAILED"
    assert STOPPED_EARLY_TAG not in client.get_run(run_id).data.tags
    # No run id (the trial never opened one) and an unknown run: nothing raises.
    callback._close_run(SimpleNamespace(trial_id="t", config={}, last_result={}), "FINISHED")
    callback._close_run(SimpleNamespace(trial_id="t", config={},
                                        last_result={"mlflow_run_id": "0" * 32}), "FINISHED")

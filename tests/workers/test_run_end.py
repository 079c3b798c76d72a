"""How a trial run ends: the one rule (workers/tracking/run_end.py) and a trial of one on its
lone trainer (workers/cohort/solo.py), the K = 1 member of every sweep's one trainable."""

from __future__ import annotations

import pytest

from tests.support.mlflow_store import sqlite_store_uri
from tests.workers.test_cohort import base_config
from workers.contract import FAILURE_TAG, MAX_ERROR_CHARS, STOPPED_EARLY_TAG, TrainingStatus
from workers.tracking.run_end import end_run_by_id, run_end


def test_the_rule_gives_each_end_its_status_and_tags():
    assert run_end(TrainingStatus.FINISHED).status == "FINISHED"
    assert run_end(TrainingStatus.FINISHED).tags == {}
    assert run_end(TrainingStatus.STOPPED).tags == {}  # its own early stopping: not from outside
    stopped = run_end(TrainingStatus.STOPPED, stopped_early=True)
    assert (stopped.status, stopped.tags, stopped.stopped_early) == ("FINISHED", {STOPPED_EARLY_TAG: "true"}, True)
    failed = run_end(TrainingStatus.FAILED, ValueError("loss became nan"))
    assert (failed.status, failed.tags) == ("FAILED", {FAILURE_TAG: "ValueError: loss became nan"})
    assert run_end("failed", None).tags == {FAILURE_TAG: "failed"}  # no reason known
    long = run_end(TrainingStatus.FAILED, "x" * (MAX_ERROR_CHARS + 10))  # text is cut as exceptions are
    assert len(long.tags[FAILURE_TAG]) == MAX_ERROR_CHARS


def test_a_run_is_ended_by_id_with_the_rules_tags(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=sqlite_store_uri(tmp_path))
    experiment = client.create_experiment("ends")
    runs = [client.create_run(experiment).info.run_id for _ in range(2)]
    end_run_by_id(client, runs[0], run_end(TrainingStatus.FAILED, "TrialDiverged: step 3"))
    end_run_by_id(client, runs[1], run_end(TrainingStatus.STOPPED, stopped_early=True))
    first, second = (client.get_run(run_id) for run_id in runs)
    assert (first.info.status, first.data.tags[FAILURE_TAG]) == ("FAILED", "TrialDiverged: step 3")
    assert (second.info.status, second.data.tags[STOPPED_EARLY_TAG]) == ("FINISHED", "true")


def test_a_trial_of_one_trains_on_its_lone_trainer_step_for_step(tmp_path):
    from workers.cohort.solo import SoloCohort
    from workers.train import Trainer

    config = base_config("discrete", epochs=2)
    alone = Trainer.create(config, tmp_path)
    expected = [alone.run_epoch()["val/loss"] for _ in range(2)]
    solo = SoloCohort(Trainer.create(config, tmp_path))
    seen: list[tuple[int, float]] = []
    for _ in range(2):
        assert [m.status for m in solo.active] == [TrainingStatus.RUNNING]
        solo.run_epoch(on_member=lambda position, metrics: seen.append((position, metrics["val/loss"])))
    assert seen == [(0, expected[0]), (0, expected[1])]  # the same numbers, bit for bit
    assert solo.members[0].status == TrainingStatus.FINISHED and solo.active == []
    solo.save_checkpoint(solo.members[0], tmp_path / "state.pt")
    restored = Trainer.create(config, tmp_path)
    restored.load_checkpoint(tmp_path / "state.pt")
    assert SoloCohort(restored).members[0].status == TrainingStatus.FINISHED  # restored at its end


def test_an_error_in_a_trial_of_one_ends_the_trial(tmp_path):
    from workers.cohort.solo import SoloCohort
    from workers.train import Trainer, TrialDiverged

    config = base_config("discrete", epochs=2)
    config = config.model_copy(update={"training": config.training.model_copy(update={"inject_nan_at_step": 1})})
    solo = SoloCohort(Trainer.create(config, tmp_path))
    with pytest.raises(TrialDiverged, match="loss became"):  # a cohort fails the member; one member is the trial
        solo.run_epoch()
    assert solo.members[0].status == TrainingStatus.RUNNING  # ended by the trainable, by the rule

"""A trial worker killed with -9 while its epochs were buffered (an MLflow outage) loses them
from memory, but not from its checkpoint: the resumed run logs them from the restored history,
so the run still holds one point per epoch, and the end values once."""

from __future__ import annotations

from mlflow.tracking import MlflowClient
from test_protocol import _config

from tests.support.mlflow_store import sqlite_store_uri
from workers.contract import WRITER_TAG
from workers.train import Trainer
from workers.trial import TrialRunner


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(point.step for point in client.get_metric_history(run_id, key))


def test_epochs_lost_with_a_killed_worker_are_logged_from_the_checkpoint(tmp_path):
    uri = sqlite_store_uri(tmp_path)
    config = _config(epochs=3, min_epochs=3)
    first = Trainer.create(config, cache_root=tmp_path / "cache")
    run = TrialRunner.start(first, uri, "backfill", "t1")
    run.log_epoch(first.run_epoch())
    run.logger.flush()  # epoch 1 reached MLflow; epochs 2 and 3 die in the buffer
    first.run_epoch()
    first.run_epoch()
    checkpoint = first.state_dict()
    assert first.finished

    resumed = Trainer.create(config, cache_root=tmp_path / "cache")
    resumed.load_state_dict(checkpoint)
    TrialRunner.attach(resumed, uri, run.logger.run_id).train()

    client = MlflowClient(tracking_uri=uri)
    run_id = run.logger.run_id
    for key in ("val/loss", "train/loss", "val/latent_nmi"):
        assert _steps(client, run_id, key) == [1, 2, 3], key
    history = client.get_metric_history(run_id, "val/loss")
    assert [p.value for p in sorted(history, key=lambda p: p.step)] == checkpoint["history"]["val/loss"]
    assert _steps(client, run_id, "selected/epoch") == [3]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_resumed_trial_claims_its_run_and_the_superseded_writer_drops_its_retries(tmp_path):
    """A worker cut off from the network trains on and retries its buffered epoch once it is
    back: the retried trial claimed the run first, so that write is dropped, not logged twice
    (the compose smoke's worker-cut-off fault, scripts/cluster_faults.py)."""
    uri = sqlite_store_uri(tmp_path)
    config = _config(epochs=2, min_epochs=2)
    first = Trainer.create(config, cache_root=tmp_path / "cache")
    cut_off = TrialRunner.start(first, uri, "claim", "t1")
    cut_off.log_epoch(first.run_epoch())
    cut_off.logger.flush()
    checkpoint = first.state_dict()
    run_id = cut_off.logger.run_id
    client = MlflowClient(tracking_uri=uri)
    assert WRITER_TAG not in client.get_run(run_id).data.tags  # a first try claims nothing
    assert not cut_off.logger.superseded()

    resumed = Trainer.create(config, cache_root=tmp_path / "cache")
    resumed.load_state_dict(checkpoint)
    retried = TrialRunner.attach(resumed, uri, run_id)
    assert client.get_run(run_id).data.tags[WRITER_TAG] == retried.logger.owner
    assert cut_off.logger.superseded() and not retried.logger.superseded()
    retried.train()
    assert _steps(client, run_id, "val/loss") == [1, 2]

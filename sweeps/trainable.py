"""The Ray Tune trainable: one trial of a sweep, with its MLflow child run.

It runs in the trial's process, possibly on another node, so every location it
needs (MLflow tracking URI, cache root) is passed explicitly. Progress goes to
Tune only through ``ray.tune.report`` with a checkpoint every epoch, so ASHA can
stop a trial and a restored sweep resumes it mid-run.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from ray import tune

from workers.contract import RUN_KIND_TAG, RUN_KIND_TRIAL
from workers.tracking import RunLogger, ensure_experiment
from workers.train import Trainer
from workers.trial import finite_metrics, log_trial_plots, trial_params

STATE_FILE = "state.pt"
RUN_FILE = "run.json"
TRIAL_ID_TAG = "ksweep.trial_id"
SWEEP_ID_TAG = "ksweep.sweep_id"
ROLE_TAG = "ksweep.role"


def _find_trial_runs(client: MlflowClient, experiment_id: str, sweep_id: str, trial_id: str):
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{SWEEP_ID_TAG}` = '{sweep_id}' and tags.`{TRIAL_ID_TAG}` = '{trial_id}'",
    )


def _open_run(
    trainer: Trainer, params: dict[str, Any], context: dict[str, Any], trial_id: str,
    checkpoint_run_id: str | None,
) -> tuple[RunLogger, int]:
    """The trial's MLflow run and the last epoch it already holds.

    Resumed from a checkpoint: attach to the run recorded in it. Started afresh (first
    try, or a retry before any checkpoint): a leftover run of this trial is deleted
    first, so no trial ever has two runs.
    """
    uri = context["tracking_uri"]
    if checkpoint_run_id is not None:
        logger = RunLogger.attach(uri, checkpoint_run_id)
        return logger, trainer.epoch
    client = MlflowClient(tracking_uri=uri)
    experiment_id = ensure_experiment(client, context["experiment_name"])
    for stale in _find_trial_runs(client, experiment_id, context["sweep_id"], trial_id):
        client.delete_run(stale.info.run_id)
    logger = RunLogger.start(
        uri, context["experiment_name"], trainer.config.name or trial_id,
        tags={SWEEP_ID_TAG: context["sweep_id"], TRIAL_ID_TAG: trial_id, ROLE_TAG: "trial",
              RUN_KIND_TAG: RUN_KIND_TRIAL,
              **{f"ksweep.{k}": v for k, v in params.items()}},
        parent_run_id=context["parent_run_id"],
    )
    logger.log_params(trial_params(trainer))
    return logger, 0


def train_trial(params: dict[str, Any], *, spec_json: str, context: dict[str, Any]) -> None:
    """Tune function trainable. ``params``: alpha, loss_stack, model, seed."""
    from sweeps.spec import SweepSpec

    spec = SweepSpec.model_validate_json(spec_json)
    config = spec.trial_config_for(params)
    trial_id = tune.get_context().get_trial_id()
    trainer = Trainer.create(config, context["cache_root"])
    checkpoint_run_id = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            trainer.load_checkpoint(Path(folder) / STATE_FILE)
            checkpoint_run_id = json.loads((Path(folder) / RUN_FILE).read_text())["run_id"]
    logger, logged_epochs = _open_run(trainer, params, context, trial_id, checkpoint_run_id)
    try:
        while trainer.epoch < config.training.epochs:
            metrics = trainer.run_epoch()
            if trainer.epoch > logged_epochs:
                logger.log_metrics(finite_metrics(metrics), step=trainer.epoch)
                logged_epochs = trainer.epoch
            with tempfile.TemporaryDirectory(prefix="ksweep-ckpt-") as folder:
                trainer.save_checkpoint(Path(folder) / STATE_FILE)
                (Path(folder) / RUN_FILE).write_text(json.dumps({"run_id": logger.run_id}))
                tune.report(
                    {**metrics, "mlflow_run_id": logger.run_id, "c_base": trainer.c_base},
                    checkpoint=tune.Checkpoint.from_directory(folder),
                )
    except SystemExit:
        # Tune ends a trial its scheduler stopped with sys.exit inside report(); ASHA also
        # "stops" a trial at max_t, right after its last epoch, which is not early.
        if trainer.epoch < config.training.epochs:
            logger.set_tags({"ksweep.stopped_early": "true"})
        else:
            log_trial_plots(logger, trainer)
        logger.finish("FINISHED")
        raise
    except Exception as error:
        logger.set_tags({"ksweep.failure": f"{type(error).__name__}: {error}"[:5000]})
        log_trial_plots(logger, trainer)
        logger.finish("FAILED")
        raise
    log_trial_plots(logger, trainer)
    logger.finish("FINISHED")

"""The Ray Tune trainable: one trial of a sweep, with its MLflow child run.

It runs in the trial's process, possibly on another node, so every location it
needs (MLflow tracking URI, cache root) is passed explicitly. Progress goes to
Tune only through ``ray.tune.report`` with a checkpoint every epoch, so ASHA can
stop a trial and a restored sweep resumes it mid-run. The run's lifecycle is
:class:`workers.trial.TrialRunner`, the one ``ksweep train`` uses.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.tracking import MlflowClient
from ray import tune

from sweeps.tune.state_backup import restored_as, seal_checkpoint
from workers.contract import (
    RUN_KIND_TAG,
    RUN_KIND_TRIAL,
    STOPPED_EARLY_TAG,
    SWEEP_ID_TAG,
    TAG_PREFIX,
    TRIAL_ID_TAG,
    TrainingStatus,
    runs_with_tag_filter,
)
from workers.tracking.retry import retrying
from workers.tracking.runs import NewRun, ensure_experiment

if TYPE_CHECKING:  # the training stack is imported where a trial runs: the driver never loads torch
    from sweeps.spec.trials import TrialConfigs
    from sweeps.tune.trial_context import TrialContext
    from workers.train import Trainer
    from workers.trial import TrialRunner

CHECKPOINT_FILE = "state.pt"
RUN_FILE = "run.json"


def param_tag(name: str) -> str:
    """The run tag mirroring a trial's search param (``ksweep.alpha``...)."""
    return f"{TAG_PREFIX}{name}"


def delete_leftover_runs(context: TrialContext, tags: dict[str, str],
                         trial_ids: set[str] | None = None) -> None:
    """Delete the sweep's runs carrying ``tags`` (one search), only those of ``trial_ids``
    when given: the runs a trial started before its last failure, with no checkpoint."""
    client = MlflowClient(tracking_uri=context.tracking_uri)
    experiment_id = ensure_experiment(client, context.experiment_name)
    stale_filter = runs_with_tag_filter(**{SWEEP_ID_TAG: context.sweep_id, **tags})
    stale_runs = retrying(lambda: client.search_runs([experiment_id], filter_string=stale_filter),
                          f"search for leftover runs of {tags}")
    for run_id in [stale.info.run_id for stale in stale_runs
                   if trial_ids is None or stale.data.tags.get(TRIAL_ID_TAG) in trial_ids]:
        retrying(lambda run_id=run_id: client.delete_run(run_id), f"delete leftover run {run_id}",
                 done=lambda run_id=run_id: client.get_run(run_id).info.lifecycle_stage == "deleted")


def open_trial_run(
    trainer: Trainer, params: dict[str, Any], context: TrialContext, trial_id: str,
    checkpoint_run_id: str | None, extra_tags: dict[str, str] | None = None,
    leftovers_deleted: bool = False,
) -> TrialRunner:
    """The trial's MLflow run: deferred (its caller settles it before each ``tune.report``), with
    PNGs when ``context.trial_plots`` (the spec's ``tracking.trial_plots``).

    Resumed from a checkpoint: attach to the run recorded in it. Started afresh (first
    try, or a retry before any checkpoint): a leftover run of this trial is deleted
    first (unless ``leftovers_deleted``: a cohort deletes its members' in one search), so no
    trial ever has two runs.
    """
    from workers.trial import TrialRunner

    uri = context.tracking_uri
    if checkpoint_run_id is not None:
        return TrialRunner.attach(trainer, uri, checkpoint_run_id, **trial_run_options(context))
    if not leftovers_deleted:
        delete_leftover_runs(context, {TRIAL_ID_TAG: trial_id})
    new_run = new_trial_run(trainer, params, context, trial_id, extra_tags)
    return TrialRunner.created(trainer, uri, *new_run.create(), **trial_run_options(context))


def trial_run_options(context: TrialContext) -> dict[str, bool]:
    """How a sweep's trial run logs: deferred epochs, PNGs only with ``tracking.trial_plots``."""
    return {"plots": context.trial_plots, "deferred": True}


def new_trial_run(trainer: Trainer, params: dict[str, Any], context: TrialContext, trial_id: str,
                  extra_tags: dict[str, str] | None = None) -> NewRun:
    """A sweep trial's new run: its tags (sweep, trial, kind, one per search param) and params."""
    from workers.trial import TrialRunner

    tags = {SWEEP_ID_TAG: context.sweep_id, TRIAL_ID_TAG: trial_id, RUN_KIND_TAG: RUN_KIND_TRIAL,
            **{param_tag(k): v for k, v in params.items()}, **(extra_tags or {})}
    return TrialRunner.new_run(trainer, context.tracking_uri, context.experiment_name,
                            trainer.config.name or trial_id, tags, context.parent_run_id)


def _ended_run(context: TrialContext, run_id: str) -> str | None:
    """How the run ended when it ended FINISHED: stopped (early, by the scheduler) or finished
    (a :class:`~workers.contract.TrainingStatus` value); None when it did not."""
    client = MlflowClient(tracking_uri=context.tracking_uri)
    run = retrying(lambda: client.get_run(run_id), f"get run {run_id}")
    if run.info.status != "FINISHED":
        return None
    stopped = run.data.tags.get(STOPPED_EARLY_TAG) == "true"
    return (TrainingStatus.STOPPED if stopped else TrainingStatus.FINISHED).value


def train_trial(params: dict[str, Any], *, configs: TrialConfigs, context: TrialContext) -> None:
    """Tune function trainable. ``params``: alpha, loss_stack, model, seed; ``configs`` builds
    this trial's configuration from them (the sweep's template and stacks, not its spec)."""
    from workers.train import Trainer
    from workers.trial import run_constants

    config = configs.trial_config_for(params)
    trial_id = tune.get_context().get_trial_id()
    trainer = Trainer.create(config, context.cache_root)
    checkpoint_run_id, tune_epoch = None, None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            trainer.load_checkpoint(Path(folder) / CHECKPOINT_FILE)
            checkpoint_run_id = json.loads((Path(folder) / RUN_FILE).read_text())["run_id"]
            tune_epoch = restored_as(Path(folder))
    ended = None if checkpoint_run_id is None else _ended_run(context, checkpoint_run_id)
    if ended == TrainingStatus.STOPPED:  # stopped early by the scheduler before the kill: it stays stopped
        return
    run = None if ended else open_trial_run(trainer, params, context, trial_id, checkpoint_run_id)
    run_id = checkpoint_run_id if run is None else run.logger.run_id
    constants = run_constants(trainer)

    def report(trainer: Trainer, epoch: int, metrics: dict[str, float], checkpoint: bool = True) -> None:
        payload = {**metrics, "mlflow_run_id": run_id, **constants}
        if not checkpoint:  # an epoch replayed to Tune ahead of the checkpoint that holds it
            tune.report(payload)
            return
        with tempfile.TemporaryDirectory(prefix="ksweep-ckpt-") as folder:
            trainer.save_checkpoint(Path(folder) / CHECKPOINT_FILE)
            (Path(folder) / RUN_FILE).write_text(json.dumps({"run_id": run_id}))
            seal_checkpoint(Path(folder))
            if run is not None:  # MLflow holds the epoch before Tune records its checkpoint
                run.settle()
            tune.report(payload, checkpoint=tune.Checkpoint.from_directory(folder))

    if tune_epoch is not None:
        _replay_to_tune(trainer, tune_epoch, report)
    if run is None:
        # The trial completed under a driver killed before Tune recorded that (its
        # experiment state is saved every few seconds). Its run is whole: touch nothing in
        # MLflow; only hand Tune the epochs it has not seen (none when the checkpoint is the
        # last epoch's), replayed from the checkpoint's exact state.
        while not trainer.finished:
            metrics = trainer.run_epoch()
            report(trainer, trainer.epoch, {**metrics, **trainer.finalize()} if trainer.finished
                   else metrics)
        return
    run.train(after_epoch=report)


def _replay_to_tune(trainer: Trainer, tune_epoch: int, report) -> None:
    """Report the epochs after ``tune_epoch`` that the restored checkpoint already holds
    (MLflow logged each before Tune saw it), from the trainer's history: Tune restored an older
    checkpoint's iteration (:func:`sweeps.tune.state_backup.fill_deleted_checkpoints`), and its
    iteration count must match the epochs again. The last one carries the checkpoint."""
    for epoch in range(tune_epoch + 1, trainer.epoch + 1):
        metrics = {name: values[epoch - 1] for name, values in trainer.history.items()
                   if len(values) >= epoch}
        last = epoch == trainer.epoch
        report(trainer, epoch, {**metrics, **trainer.finalize()} if last and trainer.finished else metrics,
               checkpoint=last)

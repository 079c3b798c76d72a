"""One trial's run in MLflow, from its first epoch (or a checkpoint) to its end: the one runner
``ksweep train`` and the Tune trainables share (:class:`TrialRunner`).

The run gets the trial's params when it starts, one metric point per epoch (none twice after a
resume, and those a checkpoint holds but the run lacks logged from the restored history), its
PNGs at the end when asked, and how it ended, by the one rule of
:mod:`workers.tracking.run_end` (:meth:`TrialRunner.end`).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.tracking import MlflowClient

from objectives.units import elbo_beta, trained_kl_weight
from workers.contract import (
    C_BASE_PARAM,
    DATASET_DIGEST_CHARS,
    ELBO_BETA_PARAM,
    TARGET_RATE_PARAM,
    TOTAL_STEPS_PARAM,
    TRAIN_TARGET_LENGTH_PARAM,
    TRAINED_BETA_PARAM,
    TrainingStatus,
)
from workers.tracking.params import flatten_config, provenance_params
from workers.tracking.run_end import RunEnd, run_end
from workers.tracking.runs import NewRun, RunLogger
from workers.train import Trainer, TrialConfig

if TYPE_CHECKING:
    from mlflow.entities import DatasetInput

EpochHook = Callable[[Trainer, int, dict[str, float]], None]


def run_constants(trainer: Trainer) -> dict[str, float]:
    """What the trial's whole run is measured in: c_base, the train split's mean number of
    active target tokens, the run's optimizer steps, beta in ELBO units (objectives/units.py;
    NaN without a kl or a reconstruction term) and the kl target rate (NaN when rate control is
    off). Params of its run, and in its last results."""
    length = float(trainer.train_data.split.mask.sum(dim=-1).double().mean())
    beta = elbo_beta(trainer.config.loss_stack, trainer.c_base, length)
    trained = trained_kl_weight(trainer.config.loss_stack, trainer.c_base)
    kl = trainer.config.loss_stack.resolved_terms().get("kl")
    target = None if kl is None else kl.options.get("target_rate")
    return {C_BASE_PARAM: trainer.c_base, TRAIN_TARGET_LENGTH_PARAM: length,
            TOTAL_STEPS_PARAM: trainer.total_steps,
            ELBO_BETA_PARAM: math.nan if beta is None else beta,
            TRAINED_BETA_PARAM: math.nan if trained is None else trained,
            TARGET_RATE_PARAM: math.nan if target is None else target}


def trial_params(trainer: Trainer) -> dict[str, Any]:
    """The params of a trial run: the named ones (docs/concepts/design.md) plus the flattened config."""
    config = trainer.config
    params: dict[str, Any] = flatten_config(config.model_dump(mode="json"))
    params.update(config.summary_params())
    params.update(run_constants(trainer))
    params["base_kind"] = trainer.base.kind
    params["device"] = str(trainer.device)
    params.update(provenance_params())
    params.update({f"data.hash.{name}": value for name, value in trainer.data_hashes.items()})
    params["data.resolved_seed"] = trainer.config.resolved_data().seed
    params.update(trainer.view.info)  # a dataset's hash (dataset_sha256), split hash, sizes
    return params


def dataset_inputs(trainer: Trainer) -> tuple[DatasetInput, ...]:
    """A dataset trial's data as an MLflow dataset input (the UI's Datasets column):
    digest = the first 32 hex characters of the content hash (MLflow caps a digest at 36;
    the full hash is the ``dataset_sha256`` param), context tag ``training``. Empty for the
    synthetic task."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    task = trainer.view.dataset
    if task is None:
        return ()
    config = task.config
    dataset = Dataset(
        name=config.dataset, digest=str(config.sha256)[:DATASET_DIGEST_CHARS],
        source_type="ksweep-dataset-store",
        source=json.dumps({"name": config.dataset, "sha256": config.sha256}),
        schema=json.dumps({"columns": task.columns}),
        profile=json.dumps({"rows": task.rows, "vocab_size": task.vocab_size,
                            "max_target_length": task.max_target_length}),
    )
    return (DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, "training")]),)


def finite_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Drop the bookkeeping key 'epoch' (the MLflow step carries it)."""
    return {key: value for key, value in metrics.items() if key != "epoch"}


def log_trial_plots(logger: RunLogger, trainer: Trainer) -> None:
    """The kappa histograms (train, val, test), the reconstruction curves and (after
    ``Trainer.finalize``) the per-position profiles per kind, as PNG artifacts."""
    # matplotlib is loaded by the runs that draw (tracking.trial_plots is opt-in in sweeps).
    from workers.plots import (
        plot_kappa_histogram,
        plot_position_profiles,
        plot_reconstruction_curves,
    )

    with tempfile.TemporaryDirectory(prefix="ksweep-plots-") as folder:
        for split, values in trainer.kappa_values.items():
            path = plot_kappa_histogram(
                values, trainer.config.alpha, Path(folder) / f"kappa_histogram_{split}.png",
                title=f"kappa_alpha on {split} (alpha = {trainer.config.alpha:g})",
            )
            logger.log_png(path)
        if trainer.history:
            path = plot_reconstruction_curves(
                trainer.history, Path(folder) / "reconstruction_curves.png",
                title=f"{trainer.config.loss_stack.label}, alpha = {trainer.config.alpha:g}",
            )
            logger.log_png(path)
        if trainer.profiles:
            path = plot_position_profiles(
                trainer.profiles, Path(folder) / "position_profiles_val.png",
                title=f"val at the selected epoch: {trainer.config.loss_stack.label}, "
                f"alpha = {trainer.config.alpha:g}",
            )
            logger.log_png(path)


def best_of(history: Mapping[str, list[float]], key: str, mode: str = "max") -> float:
    """Best finite value of a metric over the epochs (NaN when none)."""
    values = [v for v in history.get(key, []) if not math.isnan(v)]
    if not values:
        return math.nan
    return max(values) if mode == "max" else min(values)


def default_run_name(config: TrialConfig) -> str:
    """``{model}-{loss_stack}-a{alpha}-s{seed}`` unless the config names the run."""
    return config.name or (
        f"{config.model.family}-{config.loss_stack.label}-a{config.alpha:g}-s{config.seed}"
    )


class TrialRunner:
    """A trainer and its MLflow run, from the first epoch (or a checkpoint) to the end.

    ``plots``: log :func:`log_trial_plots`'s PNGs when the run ends. ``deferred``: an epoch's
    metrics are queued for the writer thread and :meth:`log_epoch` returns at once; whoever
    checkpoints the epoch calls :meth:`settle` first (the sweep's trainables do, before
    ``tune.report``), the wait a non-deferred ``log_epoch`` makes: MLflow holds every epoch a
    checkpoint holds unless the server is failing; the run's end writes them all.
    """

    def __init__(self, trainer: Trainer, logger: RunLogger, logged_epochs: int = 0, *,
                 plots: bool = True, deferred: bool = False) -> None:
        self.trainer = trainer
        self.logger = logger
        self.logged_epochs = logged_epochs
        self.final_pending = False  # the last epoch was logged without finalize()'s values
        self.plots = plots
        self.deferred = deferred

    @classmethod
    def start(
        cls, trainer: Trainer, tracking_uri: str, experiment_name: str, run_name: str,
        tags: Mapping[str, Any] | None = None, parent_run_id: str | None = None, *,
        plots: bool = True, deferred: bool = False,
    ) -> TrialRunner:
        """A new run carrying the trial's params (``plots``, ``deferred``: the class doc)."""
        new_run = cls.new_run(trainer, tracking_uri, experiment_name, run_name, tags, parent_run_id)
        return cls.created(trainer, tracking_uri, *new_run.create(), plots=plots, deferred=deferred)

    @staticmethod
    def new_run(trainer: Trainer, tracking_uri: str, experiment_name: str, run_name: str,
                tags: Mapping[str, Any] | None = None, parent_run_id: str | None = None) -> NewRun:
        """What :meth:`start` creates: the run with the trial's params and dataset input (to be
        created elsewhere, e.g. by :func:`workers.tracking.writer.create_run_later`)."""
        return NewRun(tracking_uri, experiment_name, run_name, dict(tags or {}), parent_run_id,
                      params=trial_params(trainer), inputs=dataset_inputs(trainer))

    @classmethod
    def created(cls, trainer: Trainer, tracking_uri: str, run_id: str, experiment_id: str, *,
                plots: bool = True, deferred: bool = False) -> TrialRunner:
        """The trial's run once its :meth:`new_run` is created (``run_id`` in ``experiment_id``)."""
        logger = RunLogger(MlflowClient(tracking_uri=tracking_uri), run_id, experiment_id, buffered=True)
        return cls(trainer, logger, plots=plots, deferred=deferred)

    @classmethod
    def attach(cls, trainer: Trainer, tracking_uri: str, run_id: str, *, plots: bool = True,
               deferred: bool = False) -> TrialRunner:
        """Continue the run of a trainer restored from a checkpoint (its epochs are logged).

        The run may hold epochs past the checkpoint: a trial killed after logging an epoch
        but before Tune recorded that epoch's checkpoint runs it again, and must not log it
        twice (one point per step).
        """
        logger = RunLogger.attach(tracking_uri, run_id, buffered=True)
        logger.claim()  # before reading the run: a superseded process's late write is dropped
        last_step = logger.last_step()
        run = cls(trainer, logger, logged_epochs=max(trainer.epoch, last_step), plots=plots,
                  deferred=deferred)
        run.backfill(last_step)
        return run

    def backfill(self, last_step: int) -> None:
        """Log the epochs the checkpoint holds and the run lacks (epochs buffered during an
        MLflow outage die with a worker killed by -9) from the restored per-epoch history."""
        trainer = self.trainer
        for epoch in range(last_step + 1, trainer.epoch + 1):
            metrics = {key: values[epoch - 1] for key, values in trainer.history.items()
                       if len(values) == trainer.epoch}
            self.logger.log_metrics(finite_metrics(metrics), step=epoch, wait=not self.deferred)
            self.final_pending = True

    def log_epoch(self, metrics: Mapping[str, float]) -> None:
        """Log one epoch's metrics at step = epoch, unless the run already holds it (queued
        only when ``deferred``: :meth:`settle` before checkpointing it)."""
        if self.trainer.epoch > self.logged_epochs:
            self.logger.log_metrics(finite_metrics(metrics), step=self.trainer.epoch,
                                    wait=not self.deferred)
            self.logged_epochs = self.trainer.epoch

    def settle(self) -> None:
        """Wait for the epochs logged so far as a non-deferred :meth:`log_epoch` would (written,
        unless the server is failing: they stay queued; raises if one was given up)."""
        self.logger.settle()

    def log_plots(self) -> None:
        """The run's PNGs (:func:`log_trial_plots`) when the run was asked for them, else nothing."""
        if self.plots:
            log_trial_plots(self.logger, self.trainer)

    def train(self, after_epoch: EpochHook | None = None) -> dict[str, float]:
        """Train until the budget is spent or early stopping ends it, logging every epoch,
        then end the run (see the module doc).

        The last epoch's metrics (logged, and handed to ``after_epoch``, i.e. the trial's
        last ``tune.report``) also carry :meth:`Trainer.finalize`'s values: ``selected/...``
        at the checkpoint val chose (whose weights are then restored), ``selected/epoch``,
        ``training/stop_epoch`` and the speed read-outs.

        Raises:
            Whatever training raised (after the run is ended FAILED), and ``SystemExit``
            from a scheduler's stop (after the run is ended FINISHED).
        """
        trainer = self.trainer
        metrics: dict[str, float] = {}
        try:
            while not trainer.finished:
                metrics = trainer.run_epoch()
                if trainer.finished:
                    metrics = {**metrics, **trainer.finalize()}
                self.log_epoch(metrics)
                if after_epoch is not None:
                    after_epoch(trainer, trainer.epoch, metrics)
            self.log_final()
        except SystemExit:
            # ASHA also "stops" a trial at max_t, right after its last epoch: not early.
            self.end(run_end(TrainingStatus.STOPPED, stopped_early=not trainer.finished))
            raise
        except Exception as error:
            self.end(run_end(TrainingStatus.FAILED, error))
            raise
        self.end(run_end(TrainingStatus.FINISHED))
        return metrics

    def log_final(self) -> None:
        """For a trainer restored from a checkpoint of its last epoch: :meth:`Trainer.finalize`
        (which also restores the selected weights for the plots), its values logged at the last
        step unless the run holds them already."""
        trainer = self.trainer
        if not trainer.final_metrics:
            final = trainer.finalize()
            if self.logged_epochs < trainer.epoch or self.final_pending:  # else logged
                self.logger.log_metrics(final, step=trainer.epoch)

    def end(self, end: RunEnd) -> None:
        """End the run as ``end`` says (the one rule: :func:`workers.tracking.run_end.run_end`):
        its tags, its PNGs (when asked, and not for a run stopped early: it has no selected
        checkpoint's profiles), then its status once every queued epoch is written."""
        if end.tags:
            self.logger.set_tags(end.tags)
        if not end.stopped_early:
            self.log_plots()
        self.logger.finish(end.status)


def run_logged_trial(
    config: TrialConfig,
    tracking_uri: str,
    experiment_name: str,
    cache_root: Path | str,
    *,
    tags: Mapping[str, Any] | None = None,
    parent_run_id: str | None = None,
    on_epoch: EpochHook | None = None,
    on_start: Callable[[Trainer, RunLogger], None] | None = None,
    plots: bool = True,
) -> tuple[Trainer, RunLogger]:
    """Build, train and log one trial (``ksweep train``); the run ends as :class:`TrialRunner` says.
    ``plots``: its five PNGs (on by default here: one trial, looked at by hand).

    Raises:
        TrialDiverged, TrialCheckFailed: after tagging the run with the reason.
    """
    trainer = Trainer.create(config, cache_root)
    run = TrialRunner.start(trainer, tracking_uri, experiment_name, default_run_name(config),
                         tags, parent_run_id, plots=plots)
    if on_start is not None:
        on_start(trainer, run.logger)
    run.train(after_epoch=on_epoch)
    return trainer, run.logger

"""One trial with its MLflow run: params, one metric point per epoch, PNG artifacts.

Used by ``ksweep train`` (no Ray) and by the Ray Tune trainable.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workers.plots import plot_kappa_histogram, plot_position_profiles, plot_reconstruction_curves
from workers.tracking import RunLogger, flatten_config, provenance_params
from workers.train import Trainer, TrialConfig


def trial_params(trainer: Trainer) -> dict[str, Any]:
    """The params of a trial run: the named ones of DESIGN.md plus the flattened config."""
    config = trainer.config
    params: dict[str, Any] = flatten_config(config.model_dump(mode="json"))
    params.update(config.summary_params())
    params["c_base"] = trainer.c_base
    params["base_kind"] = trainer.base.kind
    params["device"] = str(trainer.device)
    params.update(provenance_params())
    params.update({f"data.hash.{name}": value for name, value in trainer.data_hashes.items()})
    params["data.resolved_seed"] = trainer.config.resolved_data().seed
    return params


def finite_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Drop the bookkeeping key 'epoch' (the MLflow step carries it)."""
    return {key: value for key, value in metrics.items() if key != "epoch"}


def log_trial_plots(logger: RunLogger, trainer: Trainer) -> None:
    """The kappa histograms (train, val) and the reconstruction curves, as PNG artifacts."""
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


def log_final(logger: RunLogger, trainer: Trainer) -> None:
    """The end-of-run values (``selected/...``, speed read-outs) at the last epoch's step."""
    final = trainer.final_metrics or trainer.finalize()
    logger.log_metrics(final, step=trainer.epoch)


def best_of(history: Mapping[str, list[float]], key: str, mode: str = "max") -> float:
    """Best finite value of a metric over the epochs (NaN when none)."""
    values = [v for v in history.get(key, []) if not math.isnan(v)]
    if not values:
        return math.nan
    return max(values) if mode == "max" else min(values)


def run_logged_trial(
    config: TrialConfig,
    tracking_uri: str,
    experiment_name: str,
    cache_root: Path | str,
    *,
    tags: Mapping[str, Any] | None = None,
    parent_run_id: str | None = None,
    on_epoch: Callable[[Trainer, int, dict[str, float]], None] | None = None,
    on_start: Callable[[Trainer, RunLogger], None] | None = None,
) -> tuple[Trainer, RunLogger]:
    """Build, train and log one trial; the run ends FINISHED, or FAILED with the reason.

    Raises:
        TrialDiverged, TrialCheckFailed: after tagging the run with the reason.
    """
    trainer = Trainer.create(config, cache_root)
    run_name = config.name or (
        f"{config.model.family}-{config.loss_stack.label}-a{config.alpha:g}-s{config.seed}"
    )
    logger = RunLogger.start(
        tracking_uri, experiment_name, run_name, dict(tags or {}), parent_run_id=parent_run_id
    )
    logger.log_params(trial_params(trainer))
    if on_start is not None:
        on_start(trainer, logger)

    def log_epoch(trainer: Trainer, epoch: int, metrics: dict[str, float]) -> None:
        logger.log_metrics(finite_metrics(metrics), step=epoch)
        if on_epoch is not None:
            on_epoch(trainer, epoch, metrics)

    try:
        trainer.run(on_epoch=log_epoch)
    except Exception as error:
        logger.set_tags({"ksweep.failure": f"{type(error).__name__}: {error}"[:5000]})
        log_trial_plots(logger, trainer)
        logger.finish("FAILED")
        raise
    log_final(logger, trainer)
    log_trial_plots(logger, trainer)
    logger.finish("FINISHED")
    return trainer, logger

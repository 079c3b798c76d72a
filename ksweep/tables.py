"""The four tables of a sweep as pandas DataFrames, built the same way from the service's
answers (:meth:`ksweep.Client.frames`) and from MLflow alone (:func:`ksweep.frames.from_mlflow`).

- ``trials``: one row per trial: ``trial_id``, every swept value (alpha, loss_stack, model,
  seed, and beta / free_bits / target_rate when swept), what it trained with (``kl_weight``,
  ``kl_scale``, ... ``kl_target_rate``, ``prior``, ``latent_estimator``, ``selection``:
  :data:`sweeps.report.rates.TRAINED_OPTIONS`), ``state``, ``epochs``, ``selected_epoch``,
  ``error``, ``mlflow_run_id``, ``trial_hash`` (its content hash), ``reused_from`` (the sweep
  whose run it is, for a trial reused from another sweep; else empty), ``shared_by`` (the rows
  a deduplicated trial stands in, comma-separated), then the run's final value of every metric it logged, one column each
  (``test/latent_nmi``, ``selected/test/prefix/latent_nmi``, ...; NaN where not logged).
- ``cells`` and ``contrasts``: the report's tables, one row each, every key a column.
- ``history``: long format, one row per trial x epoch x metric (``trial_id``, the swept values,
  ``epoch``, ``metric``, ``value``): what ``seaborn.lineplot(..., hue="loss_stack")`` wants.

pandas is imported when a table is built, never when this module is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from service.api.schemas import Report
from workers.contract import SELECTED_EPOCH

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Frames", "build_frames"]

_TRIAL_KEYS = ("trial_id", "state", "epochs", "error", "mlflow_run_id", "trial_hash", "reused_from")


@dataclass
class Frames:
    """A sweep's tables (see the module docstring for their columns)."""

    trials: pd.DataFrame
    cells: pd.DataFrame
    contrasts: pd.DataFrame
    history: pd.DataFrame

    def table(self, name: str) -> pd.DataFrame:
        """One table by name; ValueError naming the four for any other."""
        if name not in ("trials", "cells", "contrasts", "history"):
            raise ValueError(f"table {name!r}: use trials, cells, contrasts or history")
        frame: pd.DataFrame = getattr(self, name)
        return frame


def _swept(report: Report) -> dict[str, dict[str, Any]]:
    """trial_id -> its swept values, in the report's key order."""
    return {t.trial_id: {k: v for k, v in t.model_dump().items() if k not in _TRIAL_KEYS}
            for t in report.trials}


def build_frames(report: Report, runs: Sequence[Mapping[str, Any]],
                 points: Sequence[Mapping[str, Any]]) -> Frames:
    """The four tables from the report, the trial runs (``trial_id``, ``run_id``,
    ``shared_by``, ``final``) and the history points (``trial_id``, ``metric``, ``step``,
    ``value``).

    A trial without a run (it failed before logging) keeps its row with NaN metrics; a run
    whose trial the report does not list is left out (it belongs to no row).
    """
    import pandas as pd

    swept = _swept(report)
    by_trial = {run["trial_id"]: run for run in runs}
    metric_names = sorted({name for run in runs for name in run["final"]})
    rows = []
    for trial in sorted(report.trials, key=lambda t: t.trial_id):
        run = by_trial.get(trial.trial_id, {})
        final = run.get("final", {})
        selected = final.get(SELECTED_EPOCH)
        rows.append({
            "trial_id": trial.trial_id, **swept[trial.trial_id], "state": trial.state,
            "epochs": trial.epochs, "selected_epoch": None if selected is None else int(selected),
            "error": trial.error, "mlflow_run_id": trial.mlflow_run_id,
            "trial_hash": getattr(trial, "trial_hash", None),
            "reused_from": getattr(trial, "reused_from", None),
            "shared_by": ",".join(run.get("shared_by", [])),
            **{name: final.get(name) for name in metric_names},
        })
    trials = pd.DataFrame(rows)
    if "selected_epoch" in trials:
        trials["selected_epoch"] = trials["selected_epoch"].astype("Int64")
    for name in metric_names:
        trials[name] = trials[name].astype("float64")
    cells = pd.DataFrame([cell.model_dump() for cell in report.cells])
    contrasts = pd.DataFrame([contrast.model_dump() for contrast in report.contrasts])
    history = pd.DataFrame(
        [{"trial_id": p["trial_id"], **swept.get(p["trial_id"], {}), "epoch": p["step"],
          "metric": p["metric"], "value": p["value"]} for p in points
         if p["trial_id"] in swept],
        columns=None if points else ["trial_id", "epoch", "metric", "value"])
    if "value" in history:
        history["value"] = history["value"].astype("float64")
    return Frames(trials=trials, cells=cells, contrasts=contrasts, history=history)

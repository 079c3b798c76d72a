"""Trials reused from earlier sweeps: found by content hash in MLflow, read where they are.

A sweep with ``reuse: own | visible`` looks up each trial it would run by its content hash
(the ``ksweep.trial_hash`` tag, :mod:`sweeps.plan.identity`) among the finished trial runs of
the sweeps it may read (the caller says which; None: every sweep of the tracking store). A
trial found is not trained again and not copied: its outcome is read from its own run each
time the report is built, and the report lists it with its sweep and run id.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from mlflow.tracking import MlflowClient

from sweeps.plan.build import SEARCH_AXES
from sweeps.report.readout_table import TrialOutcome
from sweeps.status import TrialState
from workers.contract import (
    C_BASE_PARAM,
    HISTORY_METRICS,
    RUN_KIND_TAG,
    RUN_KIND_TRIAL,
    SELECTED_EPOCH,
    SWEEP_ID_TAG,
    TRIAL_HASH_TAG,
    TRIAL_ID_TAG,
    runs_with_tag_filter,
)
from workers.tracking.retry import retrying
from workers.tracking.run_end import was_stopped_early

__all__ = ["find_reusable", "reused_outcomes"]


def _usable(run: Any) -> bool:
    """A FINISHED run that ran its budget, or stopped early by its own val-loss rule (it logged
    the epoch it chose); one the scheduler stopped is not comparable."""
    stopped = was_stopped_early(run.data.tags)
    return run.info.status == "FINISHED" and (not stopped or SELECTED_EPOCH in run.data.metrics)


def find_reusable(tracking_uri: str, trials: Sequence[dict[str, Any]], sweep_id: str,
                  allowed: Collection[str] | None) -> list[dict[str, Any]]:
    """Per trial (with its ``trial_hash``) that another sweep ran: the earliest usable run.

    Args:
        allowed: the sweep ids whose runs may be reused; None: any sweep but ``sweep_id``.

    Returns:
        one entry per trial found: ``trial``, ``run_id``, ``sweep_id``, ``experiment_id``,
        ``trial_id`` (its id in its own sweep).
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    experiments = retrying(lambda: [e.experiment_id for e in client.search_experiments()],
                           "search_experiments (reuse)")
    found = []
    for trial in trials:
        query = (runs_with_tag_filter(**{TRIAL_HASH_TAG: trial["trial_hash"],
                                         RUN_KIND_TAG: RUN_KIND_TRIAL})
                 + " and attributes.status = 'FINISHED'")
        runs = retrying(lambda query=query: client.search_runs(experiments, query, max_results=100),
                        "search_runs (reuse)")
        runs = [run for run in runs if _usable(run)
                and run.data.tags.get(SWEEP_ID_TAG) not in (None, sweep_id)
                and (allowed is None or run.data.tags[SWEEP_ID_TAG] in allowed)]
        if not runs:
            continue
        run = min(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))
        found.append({"trial": trial, "run_id": run.info.run_id,
                      "sweep_id": run.data.tags[SWEEP_ID_TAG],
                      "experiment_id": run.info.experiment_id,
                      "trial_id": run.data.tags.get(TRIAL_ID_TAG, run.info.run_id)})
    return found


def _history(client: MlflowClient, run_id: str) -> dict[str, list[float]]:
    curves = {}
    for name in HISTORY_METRICS:
        by_step: dict[int, float] = {}
        for point in sorted(client.get_metric_history(run_id, name), key=lambda m: (m.step, m.timestamp)):
            by_step[int(point.step)] = float(point.value)
        if by_step:
            curves[name] = [by_step[step] for step in sorted(by_step)]
    return curves


def reused_outcomes(tracking_uri: str, reused: Sequence[dict[str, Any]], epochs: int
                    ) -> list[TrialOutcome]:
    """The outcomes of reused trials, read from their own runs (final metrics, c_base, curves)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    outcomes = []
    for entry in reused:
        run = retrying(lambda entry=entry: client.get_run(entry["run_id"]),
                       f"get_run {entry['run_id']} (reused)")
        final = {name: float(value) for name, value in run.data.metrics.items()}
        if C_BASE_PARAM not in final and C_BASE_PARAM in run.data.params:
            final[C_BASE_PARAM] = float(run.data.params[C_BASE_PARAM])
        history = retrying(lambda entry=entry: _history(client, entry["run_id"]),
                           f"metric history of {entry['run_id']} (reused)")
        reached = max((len(curve) for curve in history.values()), default=epochs)
        stopped = was_stopped_early(run.data.tags)
        trial = entry["trial"]
        outcomes.append(TrialOutcome(
            trial_id=entry["trial_id"], params={key: trial.get(key) for key in SEARCH_AXES},
            state=(TrialState.STOPPED if stopped else TrialState.DONE).value,
            final=final,
            history=history, epochs=reached, run_id=entry["run_id"],
            trial_hash=trial.get("trial_hash"), reused_from=entry["sweep_id"]))
    return outcomes

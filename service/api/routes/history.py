"""``GET /api/v1/sweeps/{id}/history``: per-epoch curves of a sweep's trials, in long format.

Read from MLflow, not the service store: the store keeps each trial's latest metrics only
(what the status pages need), while every trial run in MLflow holds the whole curve and the
selected/* and test read-outs. Copying curves into the store would duplicate MLflow's data
and its retention; reading them there also serves a sweep still running. A trial the sweep
reused from another sweep is read in that sweep's run (the report lists its run id).
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import ReaderDep, ServicesDep
from service.api.errors import ProblemError
from service.api.routes.shared import INVALID, NOT_FOUND, UNAUTHORIZED, SweepId, problem
from service.api.schemas import FieldProblem, History, HistoryPoint, TrialRun
from workers.contract import SELECTED_PREFIX
from workers.tracking import reads

router = APIRouter(tags=["sweeps"])
_METRIC = re.compile(r"^[A-Za-z0-9_.\-/]{1,200}$")


def parse_metrics(values: list[str] | None) -> list[str]:
    """``?metrics=a,b&metrics=c`` as ``[a, b, c]`` (order kept, duplicates dropped); the
    default curves when none is given. 422 naming ``metrics`` for a malformed or too long list."""
    names = [name.strip() for value in values or [] for name in value.split(",") if name.strip()]
    names = list(dict.fromkeys(names)) or list(reads.DEFAULT_HISTORY_METRICS)
    bad = [name for name in names if not _METRIC.match(name)]
    if bad or len(names) > reads.MAX_HISTORY_METRICS:
        message = (f"not a metric name: {bad[0]!r} (letters, digits and _ . - / only)" if bad else
                   f"{len(names)} metrics asked for; at most {reads.MAX_HISTORY_METRICS} "
                   "per request")
        raise _invalid(message)
    return names


def _invalid(message: str) -> ProblemError:
    return ProblemError(422, "Invalid request", f"metrics: {message}", kind="invalid-request",
                        errors=[FieldProblem(field="metrics", message=message)])


@router.get(
    "/sweeps/{sweep_id}/history", response_model=History,
    summary="Per-epoch curves of every trial (long format), from MLflow",
    responses={**UNAUTHORIZED, **NOT_FOUND, **INVALID,
               503: problem("The MLflow tracking store could not be read.")},
)
def get_history(
    sweep_id: SweepId, _reader: ReaderDep, services: ServicesDep,
    metrics: Annotated[list[str] | None, Query(
        description="Metric names, comma-separated or repeated (default the report's curves: "
                    f"{', '.join(reads.DEFAULT_HISTORY_METRICS)}); each must be logged by "
                    "the sweep's trials.",
        examples=["val/latent_nmi,val/loss"])] = None,
) -> History:
    """Points are ordered by trial, metric and epoch. A sweep whose trials have not logged yet
    has no runs and no points; a metric no trial logged is refused (422) with the names to use."""
    names = parse_metrics(metrics)
    row = services.store.get_sweep(sweep_id)
    if row is None:
        raise ProblemError(404, "Sweep not found", f"no sweep with id {sweep_id!r}", kind="not-found")
    if row.experiment_id is None:  # not started: no trial has logged anything yet
        return History(sweep_id=sweep_id, metrics=names, runs=[], points=[])
    uri = services.settings.mlflow_tracking_uri
    try:
        runs = reads.trial_runs(uri, sweep_id, row.experiment_id)
        # Trials reused from other sweeps are read in their own runs (never copied here).
        runs += reads.runs_by_id(uri, reads.reused_trials(row.report))
        unknown = reads.unknown_metrics(runs, names)
        if unknown:
            logged = sorted({name for run in runs for name in run.final
                             if not name.startswith(SELECTED_PREFIX)})
            raise _invalid(f"not logged by this sweep's trials: {', '.join(unknown)}; "
                           f"logged per epoch: {', '.join(logged[:40])}")
        points = reads.metric_points(uri, runs, names)
    except ProblemError:
        raise
    except Exception as error:  # noqa: BLE001  (any MLflow store failure is one 503)
        raise ProblemError(503, "MLflow unavailable", f"cannot read {uri}: "
                           f"{type(error).__name__}: {str(error)[:300]}", kind="mlflow-unavailable"
                           ) from None
    return History(sweep_id=sweep_id, metrics=names,
                   runs=[TrialRun(trial_id=r.trial_id, run_id=r.run_id, shared_by=r.shared_by,
                                  final=r.final) for r in runs],
                   points=[HistoryPoint(**point) for point in points])

"""``GET /sweeps:compare``: the joined report of several sweeps, from the store and MLflow.

Each sweep's spec and report come from the store; its trials' final read-outs from their
MLflow runs (the store keeps the latest contract metrics only, not the ``selected/*`` values
the report reads), reused trials from the runs their report names. The report itself is
:func:`sweeps.report.compare.compare_report`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from service.api.errors import ProblemError
from service.api.schemas import FieldProblem
from service.store.db import SweepRow
from sweeps.spec import SweepSpec
from workers.tracking import reads

__all__ = ["compare"]


def compare(rows: Sequence[SweepRow], tracking_uri: str) -> dict[str, Any]:
    """The joined report of ``rows`` (in that order); 409 for a sweep without a report or for
    incompatible sweeps (every differing field named), 503 when MLflow cannot be read."""
    from sweeps.report.compare import IncompatibleSweeps, compare_report, outcomes_of

    for row in rows:
        if row.report is None:
            raise ProblemError(409, "Report not available", f"sweep {row.id} is {row.state} and "
                               "has no report yet; compare ended sweeps",
                               kind="report-not-ready", sweep_id=row.id)
    specs = {row.id: SweepSpec.model_validate(row.spec) for row in rows}
    try:
        outcomes = {}
        for row in rows:
            runs = reads.trial_runs(tracking_uri, row.id, row.experiment_id)
            runs += reads.runs_by_id(tracking_uri, reads.reused_trials(row.report))
            outcomes[row.id] = outcomes_of(row.report, [asdict(run) for run in runs])
    except Exception as error:  # noqa: BLE001  (any MLflow store failure is one 503)
        raise ProblemError(503, "MLflow unavailable", f"cannot read {tracking_uri}: "
                           f"{type(error).__name__}: {str(error)[:300]}",
                           kind="mlflow-unavailable") from None
    try:
        return compare_report(specs, outcomes, {row.id: row.name for row in rows})
    except IncompatibleSweeps as error:
        raise ProblemError(
            409, "Sweeps not comparable",
            f"the sweeps differ beyond their swept axes: {error}"[:2000],
            kind="incompatible-sweeps",
            errors=[FieldProblem(field=field, message=message)
                    for field, message in error.problems]) from None

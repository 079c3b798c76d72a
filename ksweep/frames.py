"""A sweep's DataFrames from MLflow alone, without the service: for a sweep run with
``ksweep sweep run``, on another cluster, or after the service's store is gone.

    from ksweep.frames import from_mlflow
    frames = from_mlflow("sqlite:///mlflow.db", "4a55647d4bb9")   # or an experiment name/id
    frames.cells.query("metric == 'latent_nmi' and kind == 'all'")

The tables equal :meth:`ksweep.Client.frames`'s for the same sweep (tested): both read the
report.json the driver logged on the parent run and the trial runs' metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from ksweep.tables import Frames, build_frames
from service.api.schemas import Report
from workers.contract import SWEEP_ID_TAG
from workers.tracking import reads

__all__ = ["Frames", "from_mlflow"]


def from_mlflow(tracking_uri: str, experiment_or_sweep_id: str,
                metrics: Sequence[str] | None = None) -> Frames:
    """The ``trials``, ``cells``, ``contrasts`` and ``history`` tables of one sweep.

    Args:
        tracking_uri: the MLflow store (``sqlite:///.../mlflow.db``, ``http://host:5000``).
        experiment_or_sweep_id: a sweep id, or an experiment id or name holding one sweep.
        metrics: the history's metrics (default the report's curves,
            ``workers.contract.HISTORY_METRICS``).

    Raises:
        LookupError: no such sweep, several sweeps in the experiment (their ids are listed),
            or the sweep has no report.json yet (it has not ended).
        ValueError: a metric no trial logged (named).
    """
    parent = reads.find_parent_run(tracking_uri, experiment_or_sweep_id)
    sweep_id = parent.data.tags[SWEEP_ID_TAG]
    report = reads.load_report(tracking_uri, parent.info.run_id)
    if report is None:
        raise reads.SweepNotInMlflow(
            f"sweep {sweep_id} has no {reads.REPORT_ARTIFACT} on its parent run "
            f"{parent.info.run_id}: it has not ended (or its driver was killed before writing it)")
    names = list(dict.fromkeys(metrics or reads.DEFAULT_HISTORY_METRICS))
    runs = reads.trial_runs(tracking_uri, sweep_id, parent.info.experiment_id)
    runs += reads.runs_by_id(tracking_uri, reads.reused_trials(report))
    unknown = reads.unknown_metrics(runs, names)
    if unknown:
        raise ValueError(f"metrics: not logged by sweep {sweep_id}'s trials: {', '.join(unknown)}")
    points = reads.metric_points(tracking_uri, runs, names)
    return build_frames(Report.model_validate(report), [asdict(run) for run in runs], points)

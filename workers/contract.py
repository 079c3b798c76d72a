"""Names shared across components (metrics, tags, params, UI links). Torch-, Ray- and
MLflow-free: plain constants and small pure functions only.

This branch adds only the names the sweep report and the MLflow UI summary need; the lead
merges it with the other helpers' versions.
"""

from __future__ import annotations

__all__ = [
    "RUN_KIND_SUMMARY",
    "RUN_KIND_SWEEP",
    "RUN_KIND_TAG",
    "RUN_KIND_TRIAL",
    "SHARED_BY_TAG",
    "SHARED_VIEW_TAG_PREFIX",
    "VIEW_STATE_QUERY",
    "runs_page_url",
]

RUN_KIND_TAG = "ksweep.run_kind"
RUN_KIND_TRIAL = "trial"
RUN_KIND_SUMMARY = "summary"
RUN_KIND_SWEEP = "sweep"
SHARED_BY_TAG = "ksweep.shared_by"
"""On a trial run that stands in several rows: the rows, ``stack@alpha=a`` comma-separated."""

SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
"""MLflow >= 3.15 keeps a shared runs-page view as the experiment tag ``<prefix><key>``."""
VIEW_STATE_QUERY = "viewStateShareKey"


def runs_page_url(base_url: str, experiment_id: str, share_key: str | None = None) -> str:
    """The MLflow UI runs page of an experiment, opened on a shared view when a key is given."""
    url = f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs"
    return url if share_key is None else f"{url}?{VIEW_STATE_QUERY}={share_key}"

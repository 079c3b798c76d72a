"""A cohort Tune trial seen as its members: each member is a trial in the progress record,
the service's trial list and the report, exactly as if it had run alone.

Live progress reads the compact member records of the cohort's last report
(``cohort_members``); the report reads the full records from the cohort's last checkpoint
(``members.json``: last metrics with ``selected/*`` and ``c_base``, and the curves).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sweeps.plan.build import SEARCH_AXES
from sweeps.status import TrialState, finished_state
from sweeps.tune.member_runs import member_trial_id
from sweeps.tune.search_space import MEMBERS
from workers.contract import METRIC_NAMES, TrainingStatus

__all__ = ["COHORT_MEMBERS_KEY", "ENDED", "MEMBERS_FILE", "member_state", "member_views",
           "progress_record", "saved_members"]

MEMBERS_FILE = "members.json"
"""In a cohort's checkpoint: every member's record (state, run id, epochs, error, last
metrics with ``selected/*`` and ``c_base``, the report's curves)."""
COHORT_MEMBERS_KEY = "cohort_members"
"""Key of a cohort Tune trial's report: its members' progress records as one JSON string."""
ENDED = frozenset(TrainingStatus) - {TrainingStatus.RUNNING}


def progress_record(record: dict[str, Any]) -> dict[str, Any]:
    """The compact part of a member record that goes into every report (progress, best)."""
    final = record.get("final") or {}
    return {"trial_id": record["trial_id"], "state": record["state"], "epochs": record["epochs"],
            "run_id": record["run_id"], "error": record["error"],
            "metrics": {k: final[k] for k in METRIC_NAMES if isinstance(final.get(k), float)
                        and math.isfinite(final[k])}}


def member_state(record_state: str | None, tune_state: str, epochs: int, budget: int) -> str:
    """A member's :class:`TrialState` from its record's training status and its cohort's Tune
    trial status.

    An ended member is done when it ran its budget, stopped when it ended sooner (the
    trainer's early stopping, as a lone trial), failed when it diverged. A member still
    running follows its cohort: pending, running, failed with it (ERROR), or stopped when
    Tune ended the cohort early (time budget).
    """
    if record_state in ENDED:
        return finished_state(record_state == TrainingStatus.FAILED, epochs, budget)
    if tune_state in ("ERROR", "TERMINATED"):
        return finished_state(tune_state == "ERROR", epochs, budget)
    if tune_state in ("RUNNING", "PAUSED"):
        return TrialState.RUNNING.value
    return TrialState.PENDING.value


def member_views(cohort_id: str, config: dict[str, Any], result: dict[str, Any] | None,
                 tune_state: str, budget: int) -> list[dict[str, Any]]:
    """Per member: ``trial_id, state, config, result`` (metrics, training_iteration,
    mlflow_run_id, as a lone trial's last result has them) and ``error``."""
    raw = (result or {}).get(COHORT_MEMBERS_KEY)
    records = json.loads(raw) if isinstance(raw, str) else []
    views = []
    for k, params in enumerate(config[MEMBERS]):
        record = records[k] if k < len(records) else {}
        epochs = int(record.get("epochs", 0))
        views.append({
            "trial_id": record.get("trial_id") or member_trial_id(cohort_id, k),
            "state": member_state(record.get("state"), tune_state, epochs, budget),
            "config": {key: params.get(key) for key in SEARCH_AXES},
            "result": {**record.get("metrics", {}), "training_iteration": epochs,
                       "mlflow_run_id": record.get("run_id")},
            "error": record.get("error"),
        })
    return views


def saved_members(checkpoint_dir: Path | str | None) -> list[dict[str, Any]]:
    """The full member records of a cohort's checkpoint (none without a checkpoint)."""
    if checkpoint_dir is None:
        return []
    path = Path(checkpoint_dir) / MEMBERS_FILE
    return json.loads(path.read_text()) if path.exists() else []

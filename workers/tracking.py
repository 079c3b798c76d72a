"""MLflow logging for trials and sweeps, safe to use from inside Ray trial processes.

Every call goes through an explicit :class:`mlflow.tracking.MlflowClient` bound to a
tracking URI. The fluent API (``mlflow.start_run``) keeps one active run in process-global
state, which breaks when Ray reuses a worker process for several trials or when a driver
holds a parent run while children are logged elsewhere.

Metric names and tags follow the contract in DESIGN.md ("metric names"): ``step`` is the
epoch, children carry ``mlflow.parentRunId``, and experiments carry
``mlflow.experimentKind = custom_model_development`` so MLflow 3's UI opens them on the
runs table rather than the GenAI traces overview.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.entities.lifecycle_stage import LifecycleStage
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from mlflow.utils.validation import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
)

from workers.contract import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    default_tracking_uri,
    mlflow_ui_url,
)

__all__ = [
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "RunLogger",
    "default_tracking_uri",
    "ensure_experiment",
    "find_runs",
    "flatten_config",
    "metric_history",
]


RunStatus = Literal["FINISHED", "FAILED", "KILLED"]
_TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")


def _param_value(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        text = value
    elif isinstance(value, list | tuple):
        text = json.dumps(list(value), default=str)
    else:
        text = str(value)
    return text[:MAX_PARAM_VAL_LENGTH]


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten a nested config into MLflow params.

    Args:
        config: Mapping, possibly nested (dicts of dicts).
        prefix: Prepended to every key, joined with a dot.

    Returns:
        ``{"a.b.c": "value"}``: nested mappings become dotted keys (an empty nested
        mapping contributes nothing); lists and tuples are JSON-encoded (items that JSON
        cannot encode are written with ``str``); ``None`` becomes ``"None"``; everything
        else uses ``str``. Values are truncated to MLflow's limit on a param value
        (``MAX_PARAM_VAL_LENGTH``), so logging never fails on a long value.
    """
    flat: dict[str, str] = {}
    for key, value in config.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, dotted))
        else:
            flat[dotted] = _param_value(value)
    return flat


def ensure_experiment(client: MlflowClient, name: str, artifact_location: str | None = None) -> str:
    """Get or create an experiment, tagged as a custom-model-development experiment.

    Args:
        client: Client bound to the tracking store.
        name: Experiment name.
        artifact_location: Artifact root for a newly created experiment; ignored when the
            experiment exists. ``None`` leaves the choice to the store.

    Returns:
        The experiment id. The ``mlflow.experimentKind`` tag is added when missing; an
        existing experiment whose kind someone set to another value keeps it.

    Raises:
        ValueError: If the experiment exists but is deleted (restore or purge it first,
            as with ``mlflow.set_experiment``).
    """
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(
                name,
                artifact_location=artifact_location,
                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
            )
        except MlflowException as error:
            # Another process (a parallel trial, a second driver) created it first.
            if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == LifecycleStage.DELETED:
        raise ValueError(
            f"MLflow experiment {name!r} (id {experiment.experiment_id}) is deleted; "
            "restore it or delete it permanently before logging to it"
        )
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return experiment.experiment_id


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _strict_json(value: Any) -> Any:
    # Python's json writes NaN/Infinity, which browsers and most JSON readers reject.
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): _strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict_json(item) for item in value]
    return value


class RunLogger:
    """One MLflow run, logged through an explicit client.

    Build it with :meth:`start` (a new run) or :meth:`attach` (continue a run, e.g. a
    trial resumed from a Tune checkpoint). Used as a context manager, it finishes the run
    as ``FINISHED``, or ``FAILED`` when the block raises.
    """

    def __init__(self, client: MlflowClient, run_id: str, experiment_id: str) -> None:
        self._client = client
        self._run_id = run_id
        self._experiment_id = experiment_id

    @classmethod
    def start(
        cls,
        tracking_uri: str,
        experiment_name: str,
        run_name: str,
        tags: Mapping[str, Any],
        parent_run_id: str | None = None,
        artifact_location: str | None = None,
    ) -> RunLogger:
        """Create a run (status RUNNING) in the named experiment, creating that if needed.

        Args:
            tracking_uri: MLflow tracking URI.
            experiment_name: Experiment to log into (see :func:`ensure_experiment`).
            run_name: Display name of the run.
            tags: Run tags; values are stringified.
            parent_run_id: When given, the run is tagged ``mlflow.parentRunId`` and shows
                nested under that run in the UI.
            artifact_location: Artifact root if the experiment has to be created.
        """
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment_id = ensure_experiment(client, experiment_name, artifact_location)
        run_tags = {key: str(value) for key, value in tags.items()}
        if parent_run_id is not None:
            run_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
        run = client.create_run(experiment_id, tags=run_tags, run_name=run_name)
        return cls(client, run.info.run_id, run.info.experiment_id)

    @classmethod
    def attach(cls, tracking_uri: str, run_id: str) -> RunLogger:
        """Continue an existing run.

        A run that was already terminated (e.g. marked ``FAILED`` or ``KILLED`` when its
        trial was interrupted) is set back to ``RUNNING``.

        Raises:
            MlflowException: If the run does not exist.
        """
        client = MlflowClient(tracking_uri=tracking_uri)
        run = client.get_run(run_id)
        if run.info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
        return cls(client, run_id, run.info.experiment_id)

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        self.finish("FINISHED" if exc_type is None else "FAILED")

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def experiment_id(self) -> str:
        return self._experiment_id

    @property
    def client(self) -> MlflowClient:
        return self._client

    def last_step(self) -> int:
        """The highest step any metric of the run was logged at (0 when none)."""
        keys = self._client.get_run(self._run_id).data.metrics
        return max((point.step for key in keys
                    for point in self._client.get_metric_history(self._run_id, key)), default=0)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params, flattening nested mappings (see :func:`flatten_config`).

        Params already logged with the same value are skipped, so a resumed run can
        re-log its whole config. Sent in batches of at most 100.

        Raises:
            ValueError: If a param was already logged with a different value (MLflow
                params are immutable); nothing is logged in that case.
        """
        flat = flatten_config(params)
        existing = self._client.get_run(self._run_id).data.params
        conflicts = [
            f"{key} (logged {existing[key]!r}, now {value!r})"
            for key, value in flat.items()
            if key in existing and existing[key] != value
        ]
        if conflicts:
            raise ValueError(
                f"params already logged on run {self._run_id} with different values: "
                + ", ".join(conflicts)
            )
        new = [Param(key, value) for key, value in flat.items() if key not in existing]
        for batch in _chunks(new, MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(self._run_id, params=batch, synchronous=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log one point per metric at ``step`` (the epoch).

        One ``log_batch`` call per 1000 metrics (so one call for any realistic epoch),
        all with the same timestamp. Values go through ``float`` (0-d tensors are fine);
        NaN and infinities are logged as they are, since MLflow stores them.
        """
        timestamp = int(time.time() * 1000)
        points = [Metric(key, float(value), timestamp, int(step)) for key, value in metrics.items()]
        for batch in _chunks(points, MAX_METRICS_PER_BATCH):
            self._client.log_batch(self._run_id, metrics=batch, synchronous=True)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set (or overwrite) run tags; values are stringified."""
        run_tags = [RunTag(key, str(value)) for key, value in tags.items()]
        for batch in _chunks(run_tags, MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(self._run_id, tags=batch, synchronous=True)

    def log_artifact(
        self, local_path: str | os.PathLike[str], artifact_path: str | None = None
    ) -> None:
        """Copy a local file or directory into the run's artifacts (under ``artifact_path``)."""
        self._client.log_artifact(self._run_id, os.fspath(local_path), artifact_path)

    def log_png(self, figure_path: str | os.PathLike[str], artifact_path: str = "plots") -> None:
        """Log a rendered figure, by default under ``plots/``."""
        self.log_artifact(figure_path, artifact_path)

    def log_dict_json(self, obj: Any, artifact_file: str) -> None:
        """Write ``obj`` as indented strict JSON to ``artifact_file`` in the run's artifacts.

        Non-finite floats become ``null`` (strict JSON has no NaN); objects JSON cannot
        encode are written with ``str``.
        """
        text = json.dumps(_strict_json(obj), indent=2, default=str, allow_nan=False)
        self._client.log_text(self._run_id, text, artifact_file)

    def finish(self, status: RunStatus = "FINISHED") -> None:
        """Terminate the run with ``status``.

        Raises:
            ValueError: If ``status`` is not FINISHED, FAILED or KILLED.
        """
        if status not in _TERMINAL_STATUSES:
            raise ValueError(f"status must be one of {_TERMINAL_STATUSES}, got {status!r}")
        self._client.set_terminated(self._run_id, status)

    def ui_url(self, base_url: str) -> str:
        """Link to this run in the MLflow UI served at ``base_url``."""
        return mlflow_ui_url(base_url, self._experiment_id, self._run_id)


def find_runs(tracking_uri: str, experiment_name: str, filter_string: str = "") -> list[Run]:
    """All active runs of an experiment matching an MLflow search filter, every page.

    Returns:
        The runs, newest first (MLflow's default order); empty when the experiment does
        not exist.
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return []
    runs: list[Run] = []
    page_token = None
    while True:
        page = client.search_runs(
            [experiment.experiment_id], filter_string=filter_string, page_token=page_token
        )
        runs.extend(page)
        page_token = page.token
        if not page_token:
            return runs


def metric_history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    """The ``(step, value)`` points of one metric, sorted by step (then by log time).

    Returns:
        Empty when the metric was never logged. NaN values come back as NaN.
    """
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return [(point.step, point.value) for point in points]


def _git(*args: str) -> str | None:
    import subprocess
    from pathlib import Path

    try:
        result = subprocess.run(
            ["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
            timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def provenance_params() -> dict[str, str]:
    """Code version and key package versions, as the params ``provenance.*``.

    ``provenance.git_commit`` is the commit of the checkout the code runs from ("unknown"
    outside a git checkout, e.g. an installed wheel); ``provenance.git_dirty`` is "true" when
    tracked files differ from it (untracked files do not count), "unknown" without git.
    """
    from importlib.metadata import PackageNotFoundError, version

    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    out = {
        "provenance.git_commit": commit or "unknown",
        "provenance.git_dirty": "unknown" if status is None else str(bool(status)).lower(),
    }
    for package in ("torch", "ray", "mlflow", "numpy"):
        try:
            out[f"provenance.{package}"] = version(package)
        except PackageNotFoundError:
            out[f"provenance.{package}"] = "not installed"
    return out

"""The run logger: one MLflow run written through an explicit client, safe inside Ray workers.

The fluent API (``mlflow.start_run``) keeps one active run per process, which breaks when Ray
reuses a worker for several trials or a driver holds a parent run while children log
elsewhere; every call here goes through an :class:`~mlflow.tracking.MlflowClient` bound to a
tracking URI. Names and tags follow :mod:`workers.contract`: ``step`` is the epoch, children
carry ``mlflow.parentRunId``, experiments ``mlflow.experimentKind = custom_model_development``
(MLflow 3's UI then opens the runs table). Every write is retried while the server is down
(:mod:`workers.tracking.retry`), a run's creation is idempotent (a token tag finds a run whose
reply was lost), and a trial's metrics go through a :class:`~workers.tracking.writer.MetricWriter`.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mlflow.entities import DatasetInput, Metric, Param, Run, RunTag
from mlflow.entities.lifecycle_stage import LifecycleStage
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from mlflow.utils.validation import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
)

from workers.contract import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, WRITER_TAG, mlflow_ui_url
from workers.tracking.params import flatten_config
from workers.tracking.retry import retrying, step_logged
from workers.tracking.writer import MetricWriter

__all__ = ["CREATE_TOKEN_TAG", "NewRun", "RunLogger", "RunStatus", "ensure_experiment"]

CREATE_TOKEN_TAG = "ksweep.create_token"


RunStatus = Literal["FINISHED", "FAILED", "KILLED"]
_TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")


def ensure_experiment(client: MlflowClient, name: str, artifact_location: str | None = None) -> str:
    """:func:`_ensure_experiment`, retried while the server is unreachable."""
    return retrying(lambda: _ensure_experiment(client, name, artifact_location),
                    f"experiment {name!r}")


def _ensure_experiment(client: MlflowClient, name: str, artifact_location: str | None) -> str:
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
    as ``FINISHED``, or ``FAILED`` when the block raises. Every write is retried while the
    server is unreachable (module doc); with ``buffered=True`` metrics go through a
    :class:`~workers.tracking.writer.MetricWriter`, so training goes on during an outage.
    """

    def __init__(self, client: MlflowClient, run_id: str, experiment_id: str,
                 buffered: bool = False) -> None:
        self._client = client
        self._run_id = run_id
        self._experiment_id = experiment_id
        self.owner = uuid.uuid4().hex  # this process's claim on the run (:meth:`claim`)
        self._writer = MetricWriter(client, run_id, owner=self.owner) if buffered else None

    @classmethod
    def start(
        cls,
        tracking_uri: str,
        experiment_name: str,
        run_name: str,
        tags: Mapping[str, Any],
        parent_run_id: str | None = None,
        artifact_location: str | None = None,
        buffered: bool = False,
        token: str | None = None,
        adopt: bool = False,
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
            buffered: Buffer metrics while the server is failing (a trial's epochs).
            token: The create token the run is tagged with (default: a new one).
            adopt: Take the run already made with ``token``, if any (its maker died before
                it could reply), instead of making a second one.
        """
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment_id = ensure_experiment(client, experiment_name, artifact_location)
        run_tags = {key: str(value) for key, value in tags.items()}
        if parent_run_id is not None:
            run_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
        # A retried create whose first reply was lost finds the run it made by this token.
        token = token or uuid.uuid4().hex
        run_tags[CREATE_TOKEN_TAG] = token

        def made() -> list[Run]:
            return client.search_runs([experiment_id],
                                      filter_string=f"tags.`{CREATE_TOKEN_TAG}` = '{token}'")

        run = None
        if adopt:
            run = next(iter(retrying(made, f"search for the run of token {token}")), None)
        if run is None:
            run = retrying(lambda: client.create_run(experiment_id, tags=run_tags, run_name=run_name),
                           f"create_run {run_name!r}", done=lambda: bool(made()))
        if run is None:
            run = made()[0]
        return cls(client, run.info.run_id, run.info.experiment_id, buffered=buffered)

    @classmethod
    def attach(cls, tracking_uri: str, run_id: str, buffered: bool = False) -> RunLogger:
        """Continue an existing run.

        A run that was already terminated (e.g. marked ``FAILED`` or ``KILLED`` when its
        trial was interrupted) is set back to ``RUNNING``.

        Raises:
            MlflowException: If the run does not exist.
        """
        client = MlflowClient(tracking_uri=tracking_uri)
        run = retrying(lambda: client.get_run(run_id), f"get_run {run_id}")
        if run.info.status != "RUNNING":
            retrying(lambda: client.update_run(run_id, status="RUNNING"), f"update_run {run_id}")
        return cls(client, run_id, run.info.experiment_id, buffered=buffered)

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

    @property
    def buffered_batches(self) -> int:
        """Metric batches that were queued, not written, when their epoch went on (0 unbuffered)."""
        return 0 if self._writer is None else self._writer.buffered_batches

    def _retry(self, call: Any, what: str) -> Any:
        return retrying(call, f"{what} of run {self._run_id}")

    def claim(self) -> None:
        """Make this logger the run's writer (``WRITER_TAG``): writes the one before it still
        retries are then dropped (:meth:`MetricWriter.superseded`)."""
        self._retry(lambda: self._client.set_tag(self._run_id, WRITER_TAG, self.owner), "claim")

    def superseded(self) -> bool:
        """Whether another logger claimed the run since (False when not buffered)."""
        return self._writer is not None and self._writer.superseded()

    def last_step(self) -> int:
        """The highest step any metric of the run was logged at (0 when none)."""
        def read() -> int:
            keys = self._client.get_run(self._run_id).data.metrics
            return max((point.step for key in keys
                        for point in self._client.get_metric_history(self._run_id, key)),
                       default=0)
        return self._retry(read, "last_step")

    def log_params(self, params: Mapping[str, Any], fresh: bool = False) -> None:
        """Log params, flattening nested mappings (see :func:`flatten_config`).

        Params already logged with the same value are skipped, so a resumed run can
        re-log its whole config. Sent in batches of at most 100 (one call for a trial's ~80).
        ``fresh=True`` (a run this logger just created, which holds no params) skips reading
        the run first.

        Raises:
            ValueError: If a param was already logged with a different value (MLflow
                params are immutable); nothing is logged in that case.
        """
        flat = flatten_config(params)
        existing = {} if fresh else self._retry(
            lambda: self._client.get_run(self._run_id), "get_run").data.params
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
            # Logging a param again with the same value is allowed: a retry is harmless.
            self._retry(lambda batch=batch: self._client.log_batch(
                self._run_id, params=batch, synchronous=True), "log_batch(params)")

    def log_metrics(self, metrics: Mapping[str, float], step: int, wait: bool = True) -> None:
        """Log one point per metric at ``step`` (the epoch).

        One ``log_batch`` call per 1000 metrics (so one call for any realistic epoch),
        all with the same timestamp. Values go through ``float`` (0-d tensors are fine);
        NaN and infinities are logged as they are, since MLflow stores them. A batch is
        never written twice (:mod:`workers.tracking.retry`). ``wait=False``
        (buffered loggers only; unbuffered ones always write before returning): return once
        the batch is queued; :meth:`settle` before checkpointing the step.
        """
        timestamp = int(time.time() * 1000)
        points = [Metric(key, float(value), timestamp, int(step)) for key, value in metrics.items()]
        batches = [list(batch) for batch in _chunks(points, MAX_METRICS_PER_BATCH)]
        if self._writer is not None:
            self._writer.submit(batches, wait=wait)
            return
        for batch in batches:
            first = batch[0]
            retrying(lambda batch=batch: self._client.log_batch(
                         self._run_id, metrics=batch, synchronous=True),
                     f"log_batch of step {first.step} to run {self._run_id}",
                     done=lambda first=first: step_logged(self._client, self._run_id,
                                                          first.key, first.step))

    def settle(self) -> None:
        """Wait for the queued metrics as ``log_metrics(wait=True)`` would: until written while
        writes succeed, not while the server is failing (:meth:`MetricWriter.settle
        <workers.tracking.writer.MetricWriter.settle>`; nothing to do unbuffered)."""
        if self._writer is not None:
            self._writer.settle()

    def flush(self) -> None:
        """Wait until every buffered metric is written (nothing to do unbuffered)."""
        if self._writer is not None:
            self._writer.flush()

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set (or overwrite) run tags; values are stringified."""
        run_tags = [RunTag(key, str(value)) for key, value in tags.items()]
        for batch in _chunks(run_tags, MAX_PARAMS_TAGS_PER_BATCH):
            self._retry(lambda batch=batch: self._client.log_batch(
                self._run_id, tags=batch, synchronous=True), "log_batch(tags)")

    def log_artifact(
        self, local_path: str | os.PathLike[str], artifact_path: str | None = None
    ) -> None:
        """Copy a local file or directory into the run's artifacts (under ``artifact_path``)."""
        self._retry(lambda: self._client.log_artifact(
            self._run_id, os.fspath(local_path), artifact_path), "log_artifact")

    def log_png(self, figure_path: str | os.PathLike[str], artifact_path: str = "plots") -> None:
        """Log a rendered figure, by default under ``plots/``."""
        self.log_artifact(figure_path, artifact_path)

    def log_dict_json(self, obj: Any, artifact_file: str) -> None:
        """Write ``obj`` as indented strict JSON to ``artifact_file`` in the run's artifacts.

        Non-finite floats become ``null`` (strict JSON has no NaN); objects JSON cannot
        encode are written with ``str``.
        """
        text = json.dumps(_strict_json(obj), indent=2, default=str, allow_nan=False)
        self._retry(lambda: self._client.log_text(self._run_id, text, artifact_file), "log_text")

    def finish(self, status: RunStatus = "FINISHED") -> None:
        """Terminate the run with ``status``, once every buffered metric is written.

        Raises:
            ValueError: If ``status`` is not FINISHED, FAILED or KILLED.
        """
        if status not in _TERMINAL_STATUSES:
            raise ValueError(f"status must be one of {_TERMINAL_STATUSES}, got {status!r}")
        try:
            self.flush()
        finally:  # a run whose metrics could not all be written is still ended
            self._retry(lambda: self._client.set_terminated(self._run_id, status),
                        "set_terminated")

    def ui_url(self, base_url: str) -> str:
        """Link to this run in the MLflow UI served at ``base_url``."""
        return mlflow_ui_url(base_url, self._experiment_id, self._run_id)


@dataclass(frozen=True)
class NewRun:
    """Everything a new run is created with: its tags, params and dataset inputs.

    Picklable, so a cohort's writer process can create its members' runs while the first
    epoch trains (:func:`workers.tracking.writer.create_run_later`). The token is fixed when the
    request is made, so whoever creates the run after a writer process died finds the run
    that process made, if it made one (``create(adopt=True)``).
    """

    tracking_uri: str
    experiment_name: str
    run_name: str
    tags: Mapping[str, Any]
    parent_run_id: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[DatasetInput, ...] = ()
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def create(self, adopt: bool = False) -> tuple[str, str]:
        """Create the run with its params and inputs; (run id, experiment id). ``adopt``: see
        :meth:`RunLogger.start` (the params and inputs are then written only where missing)."""
        logger = RunLogger.start(self.tracking_uri, self.experiment_name, self.run_name,
                                 self.tags, parent_run_id=self.parent_run_id, token=self.token,
                                 adopt=adopt)
        logger.log_params(self.params, fresh=not adopt)  # one log_batch for a trial's ~80
        if self.inputs:  # MLflow records an input a run already has only once
            retrying(lambda: logger.client.log_inputs(logger.run_id, datasets=list(self.inputs)),
                     f"log_inputs of run {logger.run_id}")
        return logger.run_id, logger.experiment_id


"""The REST contract: every request and response body of ``/api/v1``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sweeps import status as progress
from workers import contract

# Literals of the progress record's enums' values: the OpenAPI document keeps its inline string enums.
SweepStateValue = Literal[tuple(s.value for s in progress.SweepState)]  # type: ignore[valid-type]
TrialStateValue = Literal[tuple(s.value for s in progress.TrialState)]  # type: ignore[valid-type]

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_BASE = "https://kappa-sweep.dev/problems/"  # + a kind: the type URI of a problem document


def _as_utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; every stored time is UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


Timestamp = Annotated[datetime, AfterValidator(_as_utc)]


def utc_time(value: datetime | str | None) -> datetime | str | None:
    """A stored time, marked UTC before validation: SQLite's text (``2026-12-03 16:31:20.17``,
    naive UTC) gets a ``Z``, a naive datetime its tzinfo. :class:`Sweep`'s times are filled
    this way rather than through :data:`Timestamp`'s validator, a Python call per field that
    cost a fifth of a page of sweeps."""
    if isinstance(value, str):
        return value if value.endswith(("Z", "+00:00")) else value + "Z"
    return _as_utc(value) if value is not None else None


class FieldProblem(BaseModel):
    """One invalid field."""

    field: str = Field(..., description="Dotted path of the field in the request ('alpha.low').",
                       examples=["alpha.low"])
    message: str = Field(..., examples=["Input should be greater than or equal to 0"])


class Problem(BaseModel):
    """An error, as RFC 9457 problem details."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "type": PROBLEM_BASE + "invalid-spec", "title": "Invalid sweep spec",
        "status": 422, "detail": "1 problem in the request",
        "errors": [{"field": "alpha.low", "message": "Input should be greater than or equal to 0"}],
    }]})

    type: str = Field("about:blank", description="A URI naming the kind of problem.")
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldProblem] | None = Field(None, description="Per-field problems, if any.")
    sweep_id: str | None = Field(None, description="The sweep involved (idempotency conflicts).")


class Counters(BaseModel):
    """Trial counters; they add up to ``total``."""

    total: int
    pending: int
    running: int
    done: int
    failed: int
    stopped: int


class BestSoFar(BaseModel):
    metric: str | None = Field(None, description="The spec's primary objective metric.")
    value: float | None = None
    trial_id: str | None = None
    config: dict[str, Any] | None = Field(None, description="alpha, loss_stack, model, seed.")


class MlflowLinks(BaseModel):
    experiment_id: str | None = None
    parent_run_id: str | None = None
    ui_url: str | None = Field(None, description="The parent run in the MLflow UI.")


class DriverInfo(BaseModel):
    launcher: str | None = Field(None, description="local | ray")
    handle: str | None = Field(None, description="pid:PID@HOST or ray-job:SUBMISSION_ID")
    attempts: int = Field(..., description="Times the driver was started (restarts + 1).")


class Sweep(BaseModel):
    """A sweep and where it stands."""

    id: str
    name: str
    owner: str
    state: SweepStateValue
    counters: Counters
    progress: float = Field(..., ge=0, le=1, description="Finished trials / total.")
    best: BestSoFar
    eta_seconds: float | None = Field(None, description="Estimated seconds to the end.")
    # Times in UTC: the API fills them through `utc_time`.
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime
    error: str | None = None
    mlflow: MlflowLinks
    driver: DriverInfo
    links: dict[str, str]


class SweepListQuery(BaseModel):
    """GET /sweeps's query, checked here once: FastAPI validates the route's query with it and
    the hot read (:func:`service.api.hot_reads.list_params`) validates with it too."""

    state: SweepStateValue | None = Field(None, description="Only sweeps in this state.")
    owner: str | None = Field(None, max_length=100, description="Only this owner's.")
    limit: int = Field(50, ge=1, le=500)
    offset: int = Field(0, ge=0, le=10_000_000)


class SweepPage(BaseModel):
    items: list[Sweep]
    total: int
    limit: int
    offset: int


class Trial(BaseModel):
    trial_id: str
    state: TrialStateValue
    config: dict[str, Any] = Field(..., description="alpha, loss_stack, model, seed.")
    metrics: dict[str, float] = Field(..., description="The latest value of every metric.")
    epochs: int
    mlflow_run_id: str | None = None
    error: str | None = None
    updated_at: Timestamp


class TrialPage(BaseModel):
    items: list[Trial]
    total: int
    limit: int
    offset: int


class TermInfo(BaseModel):
    name: str
    summary: str
    weight: str = Field(..., description="What the term's weight means (e.g. beta).")
    needs: list[str]
    needs_c_base: bool
    options: dict[str, Any] = Field(..., description="JSON schema of the term's options.")


class PresetInfo(BaseModel):
    name: str
    summary: str
    terms: dict[str, Any]


class Objectives(BaseModel):
    terms: list[TermInfo]
    presets: list[PresetInfo]
    metrics: list[str] = Field(..., description="Metric names valid as sweep objectives.")


class Health(BaseModel):
    status: Literal["ok"]


class Check(BaseModel):
    ok: bool
    detail: str


class Readiness(BaseModel):
    status: Literal["ready", "degraded", "unready"]
    checks: dict[str, Check]


class HistoryPoint(BaseModel):
    """One metric of one trial at one epoch (``step``); None where the value was NaN."""

    trial_id: str
    metric: str = Field(..., examples=[contract.VAL_LATENT_NMI])
    step: int = Field(..., description="The epoch (1-based) or, for read-outs, the step logged.")
    value: float | None


class TrialRun(BaseModel):
    """A trial's MLflow run: the latest value of every metric it logged, selected/* included."""

    trial_id: str
    run_id: str
    shared_by: list[str] = Field(..., description="The rows (stack@alpha=a) the trial stands in.")
    final: dict[str, float | None]


class History(BaseModel):
    """Per-epoch curves of a sweep's trials, read from MLflow (the store keeps latest values)."""

    sweep_id: str
    source: Literal["mlflow"] = "mlflow"
    metrics: list[str] = Field(..., description="The metrics whose curves are in ``points``.")
    runs: list[TrialRun]
    points: list[HistoryPoint]


class ReportCell(BaseModel):
    """One (alpha, stack, model, beta, free_bits, target_rate, kind, metric, split) over the
    seeds; what its trials trained with (``kl_scale``, ..., ``selection``) as extra keys."""

    model_config = ConfigDict(extra="allow")

    alpha: float | None = None
    loss_stack: str
    model: str
    beta: float | None = None
    free_bits: float | None = None
    target_rate: float | None = Field(
        None, description="The rate in nats of E[KL] per example its trials trained to (None: no "
        "rate control); cells of different target rates are never paired.")
    beta_effective: float | None = None
    beta_elbo: float | None = Field(
        None, description="beta in ELBO units: effective beta x the train split's mean target "
        "length under the per-example KL, effective beta under the per-token KL (None when the "
        "trials did not log their mean target length).")
    kind: str
    metric: str
    split: str
    mean: float | None = None
    ci_low: float | None = Field(None, description="Student t 95% interval, clipped to the range.")
    ci_high: float | None = None
    n: int
    n_nan: int = 0
    seeds: list[int] = Field(default_factory=list)
    values: list[float | None] = Field(default_factory=list, description="Per seed, in `seeds` order.")
    shared_with: list[str] = Field(default_factory=list)


class ReportContrast(BaseModel):
    """A paired-by-seed difference against a baseline (every key of report.json kept)."""

    model_config = ConfigDict(extra="allow")

    contrast: str
    metric: str
    split: str
    family: str
    mean_diff: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None
    n_pairs: int = 0
    claim: str | None = None


class ReportTrial(BaseModel):
    """A trial as the report saw it: its swept values (extra keys), state and run."""

    model_config = ConfigDict(extra="allow")

    trial_id: str
    state: TrialStateValue
    epochs: int
    error: str | None = None
    mlflow_run_id: str | None = None


class Report(BaseModel):
    """report.json: cells, contrasts, best, collapse betas and limitations in words."""

    model_config = ConfigDict(extra="allow")

    sweep_id: str
    name: str
    objective: dict[str, Any]
    analysis: dict[str, Any]
    split: str = Field(..., description="The split every table reports (test when logged).")
    readout_source: str
    dedup: dict[str, Any] = Field(default_factory=dict)
    cells: list[ReportCell]
    contrasts: list[ReportContrast]
    best: list[dict[str, Any]] = Field(default_factory=list)
    collapse: list[dict[str, Any]] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    excluded: dict[str, int] = Field(default_factory=dict)
    limitations: list[str] = Field(default_factory=list)
    trials: list[ReportTrial] = Field(default_factory=list)


class ExtensionPlan(BaseModel):
    """What an extension adds (``POST /sweeps/{id}/extend:validate``), before anything runs."""

    added: dict[str, list[Any]] = Field(..., description="Per axis, the values that are new.")
    rows_before: int = Field(..., description="Rows the sweep had.")
    rows_new: int = Field(..., description="Rows the union adds (the plan's rows carry `new`).")
    trials_before: int
    trials_existing: int = Field(..., description="Trials of the union the sweep already has "
                                                  "(the plan's trials carry `exists`): not run again.")
    trials_new: int = Field(..., description="Trials that will run.")
    notes: list[str] = Field(default_factory=list)
    plan: dict[str, Any] = Field(default_factory=dict, description="The union's plan (as POST "
                                 "/sweeps:validate); empty in a replayed extension's answer.")


class Extension(BaseModel):
    """One extension of a sweep, as recorded (and as the report lists it)."""

    model_config = ConfigDict(extra="allow")

    number: int = Field(..., description="1 for the first extension.")
    added: dict[str, list[Any]]
    primary: bool = Field(..., description="Its new contrasts were declared primary before they ran.")
    after_report: dict[str, Any] | None = Field(
        None, description="The report the sweep had when it was extended (its number and headline); "
                          "none when it had none yet.")
    state_before: str
    requested_at: str
    rows: dict[str, int]
    trials: dict[str, int]


class ExtensionResult(BaseModel):
    """An accepted extension: the sweep, the record, and when its new trials run."""

    sweep: Sweep
    extension: Extension
    when: str = Field(..., description="When the new trials run, and why then.")
    plan: ExtensionPlan

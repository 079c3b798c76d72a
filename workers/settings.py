"""Every ``KSWEEP_*`` variable a trial worker reads, in one place (pydantic-settings).

Read at the moment they are needed, not once per process: a test or a launcher that sets one
before a trial starts is heard, as the environment reads they replace were; a variable set
empty counts as unset. Building the model costs about 0.3-1 ms, and an MLflow write asks for
its outage budget each time, so :func:`current_settings` parses once per distinct set of the
variables' values (a look-up of a few microseconds). docs/operations.md
("Settings") lists them with the service's. :func:`read_settings` turns a bad value into one
ValueError that names the variable and the fix (the settings modules of :mod:`sweeps` and
:mod:`service` read through it too).
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import TypeVar, cast

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_MIN_RUNS", "MEMORY_CAP_ENV", "MIN_RUNS_ENV", "MLFLOW_OUTAGE_ENV", "SYNC_WAIT_ENV",
           "WorkerSettings", "current_settings", "read_settings", "worker_settings"]

PREFIX = "KSWEEP_"
MEMORY_CAP_ENV = "KSWEEP_COHORT_MEMORY_MIB"
MIN_RUNS_ENV = "KSWEEP_WRITER_PROCESS_MIN_RUNS"
MLFLOW_OUTAGE_ENV = "KSWEEP_MLFLOW_OUTAGE_S"
SYNC_WAIT_ENV = "KSWEEP_MLFLOW_SYNC_WAIT_S"
# Below this many runs written at once, a writer process's own start (about 4 CPU-s of
# imports) costs more than the GIL time it saves the training thread (docs/performance.md).
DEFAULT_MIN_RUNS = 8

S = TypeVar("S", bound=BaseSettings)


def read_settings(cls: type[S]) -> S:
    """``cls()`` read from the environment now; a bad value: a ValueError naming its variable
    (a validator's own message as it wrote it, else ``KSWEEP_X='value': what pydantic says``)."""
    try:
        return cls()
    except ValidationError as error:
        lines = []
        for item in error.errors():
            message = str(item["msg"]).removeprefix("Value error, ")
            if item["type"] != "value_error":
                field = str(item["loc"][0]) if item["loc"] else "?"
                message = f"{PREFIX}{field.upper()}={item.get('input')!r}: {message}"
            lines.append(message)
        raise ValueError("; ".join(lines)) from None


@functools.cache
def _variables(cls: type[BaseSettings]) -> tuple[str, ...]:
    prefix = str(cls.model_config.get("env_prefix", ""))
    return tuple(f"{prefix}{name}".upper() for name in cls.model_fields)


@functools.lru_cache(maxsize=32)
def _parsed(cls: type[S], values: tuple[str | None, ...]) -> S:  # noqa: ARG001 - the cache key
    return read_settings(cls)


def current_settings(cls: type[S]) -> S:
    """:func:`read_settings`, parsed again only when one of its variables changed (a bad value
    raises every time: errors are not cached). Shared: read it, never change it."""
    return cast(S, _parsed(cls, tuple(os.environ.get(name) for name in _variables(cls))))


class WorkerSettings(BaseSettings):
    """What a trial worker reads from ``KSWEEP_*`` (each field is ``KSWEEP_<FIELD>``)."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", env_ignore_empty=True,
                                      frozen=True)  # shared by current_settings

    sweep_root: Path | None = Field(
        None, description="Set: torch inductor's compiled kernels are cached in <sweep_root>/inductor "
        "(shared by a sweep's workers); unset: under the trial's cache root.")
    cohort_memory_mib: float | None = Field(
        None, description="Memory (MiB) a worker's cohort plans its training step for; unset: the "
        "device's free memory (no limit on the CPU). A cohort that does not fit trains in chunks.")
    writer_process_min_runs: int = Field(
        DEFAULT_MIN_RUNS, description="A cohort of at least this many members writes its runs and "
        "metrics through a writer process.")
    mlflow_outage_s: float = Field(
        900.0, description="How long every MLflow write is retried before it fails.")
    mlflow_sync_wait_s: float = Field(
        10.0, description="How long a trial waits for an epoch's metrics to be written before it "
        "reports the epoch, while MLflow answers.")
    mlflow_write_timeout_s: float = Field(
        10.0, gt=0, description="How long one metric write to an MLflow server waits for its answer "
        "before it is given up (its connection reset) and retried; keep it under Ray's node-death "
        "time.")

    @field_validator("cohort_memory_mib", mode="before")
    @classmethod
    def _positive_mib(cls, value: object) -> float | None:
        text = str(value).strip() if value is not None else ""
        if not text:
            return None
        try:
            mib = float(text)
        except ValueError:
            mib = math.nan
        if not mib > 0 or math.isinf(mib):
            raise ValueError(f"{MEMORY_CAP_ENV} must be a positive number of MiB (e.g. 2048), got "
                             f"{value!r}; unset it to plan for the device's free memory")
        return mib

    @field_validator("writer_process_min_runs", mode="before")
    @classmethod
    def _whole_runs(cls, value: object) -> int:
        text = str(value).strip() if value is not None else ""
        if not text:
            return DEFAULT_MIN_RUNS
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{MIN_RUNS_ENV}={value!r}: expected a whole number of runs (a cohort "
                             "with at least that many members writes through a writer process)") from None

    @field_validator("mlflow_outage_s", "mlflow_sync_wait_s", "mlflow_write_timeout_s", mode="before")
    @classmethod
    def _seconds(cls, value: object, info: ValidationInfo) -> float:
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            name = f"{PREFIX}{str(info.field_name).upper()}"
            raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None


def worker_settings() -> WorkerSettings:
    """The worker's settings as the environment has them now."""
    return current_settings(WorkerSettings)

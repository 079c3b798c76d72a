"""Every setting of the service and its drivers: read once from the environment.

Each field is one environment variable (``KSWEEP_<FIELD>`` unless an alias says otherwise);
docs/operations.md ("Settings") lists them all. Defaults are the embedded set-up: a SQLite store and the local
sqlite MLflow store under the working directory, one local driver process per sweep.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.contract import LOCAL_MLFLOW_UI, default_tracking_uri

ADMIN_OWNER = "admin"
LOCAL_OWNER = "local"  # the owner of a service without KSWEEP_API_TOKENS, and of the local stores
LOCAL_TOKEN_FILE = "api-token"


class Settings(BaseSettings):
    """The service's configuration (``KSWEEP_*``, plus ``MLFLOW_TRACKING_URI`` and ``RAY_ADDRESS``)."""

    model_config = SettingsConfigDict(env_prefix="KSWEEP_", extra="ignore", populate_by_name=True)

    host: str = Field("127.0.0.1", description="Interface `ksweep serve` binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port `ksweep serve` listens on.")
    sweep_root: Path = Field(
        Path(".ksweep"),
        description="Tune state, caches, driver logs and (by default) the service's SQLite store.",
    )
    model_root: Path | None = Field(
        None,
        description="Registered language models (`ksweep model add`); default <sweep_root>/models. "
        "Administrators point it at a shared folder for the service.",
    )
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the service store; default sqlite:///<sweep_root>/service.db "
        "(WAL mode). Postgres: postgresql+psycopg://user@host/db.",
    )
    api_tokens: str = Field(
        "", repr=False,
        description="Comma-separated owner:token pairs allowed to submit and cancel; the owner "
        "`admin` may act on every sweep. Empty: `ksweep serve` generates a token for owner `local` "
        "into <sweep_root>/api-token (mode 0600) and the CLI finds it there.",
    )
    read_auth: bool = Field(False, description="Require a token for reads (GET) too.")
    mlflow_tracking_uri: str = Field(
        default_factory=default_tracking_uri,
        validation_alias=AliasChoices("MLFLOW_TRACKING_URI", "KSWEEP_MLFLOW_TRACKING_URI"),
        description="Where drivers and trials log (default sqlite:///$PWD/mlflow.db).",
    )
    mlflow_ui_url: str = Field(
        LOCAL_MLFLOW_UI,
        description="Base URL of the MLflow UI, for the links the API returns.",
    )
    launcher: Literal["local", "ray"] = Field(
        "local", description="How a sweep's driver runs: a local process, or a Ray Job."
    )
    ray_address: str | None = Field(
        None,
        validation_alias=AliasChoices("RAY_ADDRESS", "KSWEEP_RAY_ADDRESS"),
        description="Ray cluster for local drivers (default: each driver starts a local Ray).",
    )
    ray_jobs_url: str = Field(
        "http://127.0.0.1:8265",
        description="Ray dashboard / Jobs API address used by the `ray` launcher.",
    )
    ray_jobs_timeout_s: float = Field(
        10.0, gt=0, description="Timeout of one Jobs API health check; no answer in time means "
        "the driver's health is unknown (never a restart).",
    )
    driver_num_cpus: int | None = Field(
        None, ge=1, description="CPUs of the local Ray a local driver starts (default: all)."
    )
    max_concurrent_sweeps: int = Field(
        1, ge=0, description="Sweeps running at once; the rest wait in order. 0 pauses the queue."
    )
    max_active_sweeps_per_owner: int = Field(
        8, ge=1, description="Queued + running sweeps one owner may have (more: 429)."
    )
    max_trials_per_sweep: int = Field(1000, ge=1, description="Largest trial count accepted.")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Largest request body accepted.")
    max_driver_restarts: int = Field(
        2, ge=0, description="Times a sweep whose driver died is restarted before it fails."
    )
    poll_interval_s: float = Field(1.0, gt=0, description="How often the supervisor looks at drivers.")
    head_restart_window_s: float = Field(
        300.0, ge=0, description="A Ray head that stops answering and is back within this many "
        "seconds without a sweep's driver (restarted without its state) gets the driver started "
        "again as a new Ray Job with no restart spent; back later, it counts as a driver death.",
    )
    lease_ttl_s: float = Field(
        10.0, gt=0, description="How long the supervisor lease in the store lasts without renewal "
        "(renewed every poll): a standby API process takes over this long after the leader died.",
    )
    list_cache_s: float = Field(
        1.0, ge=0, description="GET /sweeps pages are reused for this long (dropped at once when "
        "this API writes; driver progress shows within it). 0: no cache.",
    )
    access_log: bool = Field(
        False, description="uvicorn's access log: a line per request on stderr. Off by default: "
        "it costs 0.1-0.2 ms of server CPU per small read, a quarter of a GET /sweeps/{id}, and "
        "mostly records polls; unexpected errors are logged either way.",
    )
    cancel_grace_s: float = Field(10.0, ge=0, description="SIGTERM-to-SIGKILL wait on cancel.")
    data_root: Path | None = Field(
        None, description="The dataset registry (docs/guide/datasets.md); default "
        "<sweep_root>/datasets. Drivers and workers get it passed down with the trial config.",
    )
    max_dataset_bytes: int = Field(
        1 << 30, ge=1024, description="Largest dataset upload (POST /datasets): Content-Length "
        "checked first, the stream cut at this + 1 byte (413).",
    )
    max_dataset_rows: int = Field(
        2_000_000, ge=1, description="Rows of one dataset (from the Parquet footer before any "
        "data is read; while reading for Arrow and JSONL).",
    )
    max_dataset_tokens: int = Field(
        200_000_000, ge=1, description="Token ids in x plus y over one dataset's rows.",
    )
    max_dataset_line_bytes: int = Field(
        8 << 20, ge=1024, description="Longest JSONL line of a dataset upload (422 naming the row).",
    )
    dataset_quota_bytes: int = Field(
        8 << 30, ge=0, description="Stored (canonical, zstd Parquet) bytes of datasets per owner.",
    )
    dataset_validate_memory_bytes: int = Field(
        4 << 30, ge=0, description="Address-space limit (RLIMIT_AS) of the subprocess that "
        "validates an upload; 0: none. Below ~600 MB pyarrow itself cannot load.",
    )
    dataset_validate_timeout_s: float = Field(
        300.0, gt=0, description="The validation subprocess is killed after this long (422).",
    )
    store_outage_s: float = Field(
        600.0, ge=0, description="How long a driver retries its start, final status and failure "
        "against an unreachable service store (read at each retried call, not cached).",
    )

    @field_validator("sweep_root", "model_root")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # Drivers and Ray workers run in other directories: every path they get is absolute.
        return None if value is None else value.expanduser().resolve()

    @property
    def resolved_model_root(self) -> Path:
        """KSWEEP_MODEL_ROOT, or <sweep_root>/models."""
        return self.model_root or self.sweep_root / "models"

    @property
    def store_url(self) -> str:
        return self.database_url or f"sqlite:///{self.sweep_root / 'service.db'}"

    @property
    def dataset_root(self) -> Path:
        """Where the dataset registry lives (KSWEEP_DATA_ROOT, default <sweep_root>/datasets)."""
        return (self.data_root.expanduser().resolve() if self.data_root is not None
                else self.sweep_root / "datasets")

    @property
    def local_token_path(self) -> Path:
        return self.sweep_root / LOCAL_TOKEN_FILE

    def configured_tokens(self) -> dict[str, str]:
        """sha256(token) -> owner for every configured token (only hashes are kept around)."""
        tokens: dict[str, str] = {}
        for pair in filter(None, (item.strip() for item in self.api_tokens.split(","))):
            owner, sep, token = pair.partition(":")
            if not sep or not owner.strip() or not token.strip():
                raise ValueError(
                    "KSWEEP_API_TOKENS: each entry must be owner:token, comma-separated "
                    f"(got an entry starting {pair[:8]!r})"
                )
            tokens[hash_token(token.strip())] = owner.strip()
        return tokens


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()

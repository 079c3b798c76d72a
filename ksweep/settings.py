"""Every ``KSWEEP_*`` variable the client and the ``ksweep`` command read, from the environment.

``KSWEEP_URL`` and ``KSWEEP_TOKEN``; with no token set, the token a local ``ksweep serve``
generated under ``KSWEEP_SWEEP_ROOT`` (owner ``local``). The command's local stores are
``KSWEEP_DATA_ROOT`` and ``KSWEEP_MODEL_ROOT``. Neither ever builds the service's settings;
both read these when a command runs (:func:`client_settings`), never at import.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.settings import LOCAL_TOKEN_FILE

__all__ = ["ClientSettings", "client_settings"]


class ClientSettings(BaseSettings):
    """The client's and the command's configuration (each field is ``KSWEEP_<FIELD>``)."""

    model_config = SettingsConfigDict(env_prefix="KSWEEP_", extra="ignore", env_ignore_empty=True)

    url: str = Field("http://127.0.0.1:8000", description="Service URL for the CLI client "
                     "(`ksweep data` asks a service only when KSWEEP_URL is set: the local store "
                     "otherwise).")
    token: str | None = Field(None, repr=False, description="Bearer token for the CLI client.")
    sweep_root: Path = Field(Path(".ksweep"), description="Where a local `ksweep serve` keeps "
                             "the token it generated (api-token); the local commands' Tune state "
                             "and caches.")
    data_root: Path | None = Field(None, description="The local dataset store of `ksweep data` "
                                   "and `ksweep sweep run`; default <sweep_root>/datasets.")
    model_root: Path | None = Field(None, description="The local model store of `ksweep model`; "
                                    "default <sweep_root>/models.")
    print_report_json: bool = Field(False, description="`ksweep sweep run` prints the report as "
                                    "JSON too, after its tables (for scripts).")

    @field_validator("sweep_root", "data_root", "model_root")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().resolve()

    @property
    def url_given(self) -> bool:
        """Whether ``KSWEEP_URL`` is set (not empty): ``ksweep data`` asks that service then."""
        return "url" in self.model_fields_set and bool(self.url)

    @property
    def dataset_root(self) -> Path:
        """KSWEEP_DATA_ROOT, default <sweep_root>/datasets."""
        return self.data_root or self.sweep_root / "datasets"

    @property
    def resolved_model_root(self) -> Path:
        """KSWEEP_MODEL_ROOT, default <sweep_root>/models."""
        return self.model_root or self.sweep_root / "models"

    def bearer_token(self) -> str | None:
        """``KSWEEP_TOKEN``, else the local service's generated token, else None (anonymous)."""
        if self.token:
            return self.token
        local = self.sweep_root / LOCAL_TOKEN_FILE
        return local.read_text().strip() if local.is_file() else None


def client_settings() -> ClientSettings:
    """The settings as the environment has them now (read afresh: a script or test may set a
    variable between two commands)."""
    return ClientSettings()

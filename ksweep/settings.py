"""Where the client finds the service and its token, from the environment.

``KSWEEP_URL`` and ``KSWEEP_TOKEN``; with no token set, the token a local ``ksweep serve``
generated under ``KSWEEP_SWEEP_ROOT`` (owner ``local``). The client reads these three only: it
never builds the service's settings.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.settings import LOCAL_TOKEN_FILE

__all__ = ["ClientSettings"]


class ClientSettings(BaseSettings):
    """The client's configuration (``KSWEEP_URL``, ``KSWEEP_TOKEN``, ``KSWEEP_SWEEP_ROOT``)."""

    model_config = SettingsConfigDict(env_prefix="KSWEEP_", extra="ignore")

    url: str = Field("http://127.0.0.1:8000", description="Service URL for the CLI client "
                     "(`ksweep data` asks a service only when KSWEEP_URL is set: the local store "
                     "otherwise).")
    token: str | None = Field(None, repr=False, description="Bearer token for the CLI client.")
    sweep_root: Path = Field(Path(".ksweep"), description="Where a local `ksweep serve` keeps "
                             "the token it generated (api-token).")

    @field_validator("sweep_root")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    def bearer_token(self) -> str | None:
        """``KSWEEP_TOKEN``, else the local service's generated token, else None (anonymous)."""
        if self.token:
            return self.token
        local = self.sweep_root / LOCAL_TOKEN_FILE
        return local.read_text().strip() if local.is_file() else None

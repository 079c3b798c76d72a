"""Every ``KSWEEP_*`` variable the sweep driver reads itself, in one place (pydantic-settings).

Read when needed (a launcher or a test sets them before the driver asks). What its trial
workers read is :mod:`workers.settings`; docs/operations.md ("Settings") lists both.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.settings import PREFIX, current_settings

__all__ = ["LOCAL_RAY_MODES", "DriverSettings", "driver_settings"]

LOCAL_RAY_MODES = ("lean", "full")


class DriverSettings(BaseSettings):
    """What a sweep's driver reads from ``KSWEEP_*`` (each field is ``KSWEEP_<FIELD>``)."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", env_ignore_empty=True,
                                      frozen=True)  # shared by current_settings

    local_ray: Literal["lean", "full"] = Field(
        "lean", description="`lean`: a driver's local Ray starts without its autoscaler monitor, "
        "log monitor and API server, which a one-node sweep does not use; `full`: Ray's own set "
        "(for `ray status` or the state API on it).")

    @field_validator("local_ray", mode="before")
    @classmethod
    def _mode(cls, value: object) -> str:
        mode = str(value or "").strip() or "lean"
        if mode not in LOCAL_RAY_MODES:
            raise ValueError(f"KSWEEP_LOCAL_RAY={value!r}: expected one of {', '.join(LOCAL_RAY_MODES)} "
                             "(lean, the default, starts a local Ray without the daemons a one-node "
                             "sweep does not use)")
        return mode


def driver_settings() -> DriverSettings:
    """The driver's settings as the environment has them now."""
    return current_settings(DriverSettings)

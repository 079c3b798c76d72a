"""Every ``KSWEEP_*`` variable the repository's scripts read (the compose smoke test and the
loopback cluster), in one place; the packages' own are in their ``settings.py`` modules.

The scripts import it as they import each other (``scripts/`` is the first entry of their
``sys.path``). Read when asked, as the environment reads it replaces were; a variable set
empty counts as unset. (``KSWEEP_PYTHON``, the interpreter, is read by the shell wrappers.)
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ScriptSettings", "script_settings"]


class ScriptSettings(BaseSettings):
    """What the scripts read from ``KSWEEP_*`` (each field is ``KSWEEP_<FIELD>``)."""

    model_config = SettingsConfigDict(env_prefix="KSWEEP_", extra="ignore", env_ignore_empty=True)

    smoke_debian_mirror: str = Field("http://deb.debian.org/debian", description="The Debian "
                                     "mirror the compose smoke test's debootstrap stand-ins use.")
    smoke_storage_driver: str | None = Field(None, description="dockerd's --storage-driver when "
                                             "the smoke test starts its own dockerd.")
    smoke_api_token: str | None = Field(None, repr=False, description="The compose smoke test's "
                                        "admin token; default a fresh random one.")
    build_ca_bundle: str | None = Field(None, description="A CA bundle copied into the images' "
                                        "build (default: pip's `cert` setting).")
    cluster_dir: Path = Field(Path(".ksweep/cluster"), description="The loopback cluster's "
                              "state directory.")
    cluster_timeout: float = Field(240.0, gt=0, description="Seconds each of the loopback "
                                   "cluster's health waits may take.")


def script_settings() -> ScriptSettings:
    """The scripts' settings as the environment has them now."""
    return ScriptSettings()

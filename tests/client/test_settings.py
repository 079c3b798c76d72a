"""Where the client finds the service and its token: KSWEEP_URL, KSWEEP_TOKEN, else a local
service's generated token; never from the service's own settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from ksweep import Client


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A shell with no KSWEEP_* variable but the sweep root, and a server setting that is invalid."""
    for name in ("KSWEEP_URL", "KSWEEP_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KSWEEP_SWEEP_ROOT", str(tmp_path))
    monkeypatch.setenv("KSWEEP_PORT", "not-a-port")  # the service would refuse to start on it
    return tmp_path


def _auth(client: Client) -> str | None:
    with client:
        return client.http.headers.get("Authorization")


def test_without_a_token_the_client_reads_the_local_service_token(shell: Path) -> None:
    assert _auth(Client()) is None  # no token anywhere: anonymous reads
    (shell / "api-token").write_text("generated-by-serve\n")
    client = Client()
    assert client.url == "http://127.0.0.1:8000"
    assert _auth(client) == "Bearer generated-by-serve"


def test_the_environment_and_the_arguments_come_first(shell: Path, monkeypatch) -> None:
    (shell / "api-token").write_text("generated-by-serve\n")
    monkeypatch.setenv("KSWEEP_TOKEN", "from-env")
    monkeypatch.setenv("KSWEEP_URL", "http://service:9000/")
    client = Client()
    assert client.base == "http://service:9000/api/v1" and _auth(client) == "Bearer from-env"
    assert _auth(Client("http://other", "given")) == "Bearer given"

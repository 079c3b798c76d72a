"""A token never reaches a log, a driver or a trial; nothing the service starts listens beyond
loopback (the API, the driver, and the local Ray the driver starts)."""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import TOKENS, auth, tiny_spec
from test_lifecycle import _driver_pid, _wait

from tests.support.sockets import listening, loopback

pytestmark = pytest.mark.slow



def _group(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _session_dirs(procs: list[psutil.Process]) -> set[Path]:
    dirs = set()
    for proc in procs:
        try:
            for arg in proc.cmdline():
                match = re.search(r"(/\S*/session_[0-9_-]+[0-9])", arg)
                if match:
                    dirs.add(Path(match.group(1)))
        except psutil.Error:
            continue
    return dirs


def _check_no_token(procs: list[psutil.Process], token: str) -> None:
    """The driver and its workers never got the API's tokens."""
    for proc in procs:
        try:
            assert not any(token in value for value in proc.environ().values()), proc.name()
        except psutil.Error:
            continue


def test_tokens_stay_out_of_logs_and_everything_bindsloopback(make_service, tmp_path: Path):
    token = f"secret-{uuid.uuid4().hex}"
    service = make_service(KSWEEP_API_TOKENS=f"carol:{token},alice:{TOKENS['alice']}")
    headers = {"Authorization": f"Bearer {token}"}
    client = service.client()
    sweep = client.post("/sweeps", json=tiny_spec("secrets", alpha=[0], loss_stacks=["uniform"], **{
        # About 4 s of training on a free CPU: Ray's daemons stay up through the 4 s of gathering
        # below (each process is read as it is seen, so a sweep that ends sooner fails nothing).
        "template.training.epochs": 16}), headers=headers)
    assert sweep.status_code == 201, sweep.text
    sweep_id = sweep.json()["id"]
    # Wrong, truncated and right tokens: none may be echoed anywhere.
    assert client.post(f"/sweeps/{sweep_id}/cancel", headers={
        "Authorization": f"Bearer {token[:-1]}"}).status_code == 401
    assert client.post(f"/sweeps/{sweep_id}/cancel", headers=auth("alice")).status_code == 403
    assert client.get(f"/sweeps/{sweep_id}", headers=headers).status_code == 200

    # While a trial runs: every socket the API, the driver and its local Ray listen on.
    running = _wait(client, sweep_id, lambda s: s["counters"]["running"] >= 1,
                    what="a running trial")
    driver = _driver_pid(running)
    group: dict[int, psutil.Process] = {}
    sockets: dict[tuple[str, int], str] = {}
    names: set[str] = set()
    sessions: set[Path] = set()
    for polls in range(60):  # Ray's daemons come up one by one; gather what listens a while
        members = _group(driver)
        if not members:  # the driver and its Ray have ended: nothing more to gather
            break
        # Each process read while it lives: its sockets, environment and Ray session folder.
        new = [p for p in members if p.pid not in group]
        group |= {p.pid: p for p in new}
        _check_no_token(new, token)
        sessions |= _session_dirs(new)
        sockets |= listening(members)
        names |= set(sockets.values())
        if polls >= 8 and any("raylet" in n for n in names) and any("gcs" in n for n in names):
            break
        time.sleep(0.5)
    assert any("raylet" in n for n in names) and any("gcs" in n for n in names), names
    api = listening([psutil.Process(service.process.pid)])
    assert api and all(loopback(ip) for ip, _ in api), api
    wide = {addr: name for addr, name in sockets.items() if not loopback(addr[0])}
    assert not wide, f"listening beyond loopback: {wide}"
    assert sessions, "found no Ray session folder"

    final = _wait(client, sweep_id, lambda s: s["state"] in ("succeeded", "failed"), what="end")
    assert final["state"] == "succeeded", final
    logs = [p for p in tmp_path.rglob("*") if p.is_file()]
    for session in sessions:
        logs += [p for p in session.rglob("*") if p.is_file() and p.stat().st_size < 50_000_000]
    assert any(p.name == "serve.log" for p in logs) and any("driver-" in p.name for p in logs)
    leaks = [str(p) for p in logs if token.encode() in p.read_bytes()]
    assert not leaks, f"the token appears in {leaks}"

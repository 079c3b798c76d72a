"""Rows of the fault matrix (docs/reliability.md) with real processes on loopback."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest
from conftest import auth, tiny_spec
from sweep_checks import wait_until

pytestmark = pytest.mark.slow


def test_kill9_of_the_api_amid_posts_then_retries_give_one_sweep_per_key(make_service):
    service = make_service(KSWEEP_MAX_CONCURRENT_SWEEPS="0",
                           KSWEEP_MAX_ACTIVE_SWEEPS_PER_OWNER="1000")
    keys = [f"retry-{uuid.uuid4().hex}" for _ in range(40)]
    first_answers: dict[str, int | str] = {}

    def post(key: str) -> None:
        try:
            with httpx.Client(base_url=service.url, timeout=30) as client:
                response = client.post("/sweeps", json=tiny_spec(f"k{key[-6:]}"),
                                       headers={**auth("alice"), "Idempotency-Key": key})
                first_answers[key] = response.status_code
        except httpx.HTTPError as error:
            first_answers[key] = type(error).__name__

    threads = [threading.Thread(target=post, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    # kill -9 once some POSTs have been answered and others are still in flight.
    wait_until(lambda: sum(v == 201 for v in first_answers.values()) >= 5, 120, "a few answered POSTs")
    service.kill9()
    for thread in threads:
        thread.join(timeout=60)
    lost = [k for k in keys if first_answers.get(k) != 201]
    service.start()

    ids = {}
    with service.client() as client:
        for key in keys:  # every client retries with its key, answered or not
            response = client.post("/sweeps", json=tiny_spec(f"k{key[-6:]}"),
                                   headers={**auth("alice"), "Idempotency-Key": key})
            assert response.status_code in (200, 201), response.text
            if first_answers.get(key) == 201:
                assert response.status_code == 200  # stored before the kill: replayed
            ids[key] = response.json()["id"]
        total = client.get("/sweeps", params={"limit": 1}).json()["total"]
    assert len(set(ids.values())) == len(keys) == total
    print(f"{len(lost)} of {len(keys)} POSTs had no 201 before the kill; "
          f"every key has exactly one sweep after the retries")

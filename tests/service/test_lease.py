"""The store's lease on a real SQLite store: one holder at a time, taken over after expiry."""

from __future__ import annotations

import time

from service.store.lease import Lease
from service.store.queries import Store


def test_one_holder_at_a_time_and_a_takeover_after_expiry(tmp_path):
    url = f"sqlite:///{tmp_path / 'service.db'}"
    first_store, second_store = Store(url), Store(url)  # two processes' worth of engines
    try:
        first = Lease(first_store, "first", ttl_s=1.0)
        second = Lease(second_store, "second", ttl_s=1.0)
        assert first.hold() and not second.hold()
        assert first.hold()  # renewal
        generation = first_store.generation
        assert second.current().holder == "first" and second.current().valid()
        time.sleep(1.2)  # first stops renewing (it died)
        assert second.hold() and not first.hold()
        assert first.current().holder == "second"
        assert first_store.generation == generation  # renewals do not drop cached pages
        second.release()
        assert first.current() is None and first.hold()
    finally:
        first_store.close()
        second_store.close()

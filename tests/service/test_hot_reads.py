"""The hot reads' own parts (service.api.hot_reads): which list queries they answer, and the
threads that read the store off the event loop. Their answers over HTTP: test_api.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.api.hot_reads import LIST_DEFAULTS, ReadThreads, list_params


@pytest.mark.parametrize(("query", "expected"), [
    (b"", {}),
    (b"limit=7", {"limit": 7}),
    (b"state=failed&owner=bob&limit=500&offset=10000000", {"state": "failed", "owner": "bob",
                                                           "limit": 500, "offset": 10_000_000}),
    (b"owner=%C3%9F", {"owner": "ß"}),
    (b"offset=0007", {"offset": 7}),
    # Odd but valid: the model FastAPI validates the route's query with reads them so too.
    (b"limit=+5", {"limit": 5}), (b"limit=5.0", {"limit": 5}), (b"limit= 5", {"limit": 5}),
])
def test_list_params_reads_ordinary_queries(query, expected):
    assert list_params(query) == {**LIST_DEFAULTS, **expected}


@pytest.mark.parametrize("query", [
    b"limit=0", b"limit=501", b"offset=10000001", b"limit=-1", b"limit=5.5", b"state=sleeping", b"owner=", b"owner=" + b"x" * 101, b"limit=5&limit=6",
    b"page=2", b"limit", b"state=queued&state=running", b"limit=99999999999",
])
def test_list_params_leaves_the_rest_to_fastapi(query):
    assert list_params(query) is None


def test_read_threads_run_off_the_loop_and_hand_back_results_and_errors():
    threads = ReadThreads(2)

    async def main() -> None:
        loop_thread = threading.get_ident()
        assert await threads.run(threading.get_ident) != loop_thread
        assert await asyncio.gather(*(threads.run(lambda n=n: n * n) for n in range(20))) == \
            [n * n for n in range(20)]
        with pytest.raises(KeyError, match="missing"):
            await threads.run(lambda: {}["missing"])

    asyncio.run(main())
    running = list(threads._threads)
    assert len(running) == 2
    threads.close()
    for thread in running:
        thread.join(timeout=5)
        assert not thread.is_alive()

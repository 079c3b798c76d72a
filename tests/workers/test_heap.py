"""``workers.imports.heavy_imports``: the collector off during the block, restored after, the heap frozen."""

import gc

import pytest

from workers.imports import heavy_imports


@pytest.fixture(autouse=True)
def _restore_gc():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    gc.enable() if enabled else gc.disable()


def test_the_collector_is_off_inside_and_back_on_after_with_the_heap_frozen():
    gc.enable()
    gc.unfreeze()
    with heavy_imports():
        assert not gc.isenabled()
        made = [[index] for index in range(1000)]  # tracked containers built inside
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(made)


def test_a_collector_that_was_off_stays_off_and_an_error_still_restores_and_freezes():
    gc.disable()
    gc.unfreeze()
    with pytest.raises(ImportError), heavy_imports():
        import no_such_module_here  # noqa: F401
    assert not gc.isenabled()
    assert gc.get_freeze_count() > 0
    gc.enable()
    with pytest.raises(RuntimeError), heavy_imports():
        raise RuntimeError("inside")
    assert gc.isenabled()

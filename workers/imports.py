"""Heavy imports with the cyclic garbage collector off.

Importing torch, Ray, MLflow and scikit-learn builds a heap of millions of objects, and the
collector's full passes over it while the imports run cost about a third of their time (the
training stack in a Ray worker: 1.6 s -> 1.1 s on the 2-CPU development machine). An import
leaves no cyclic garbage worth a pass, so these imports run with the collector off, and what
they built is then frozen (``gc.freeze``): later collections do not walk it again.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def heavy_imports() -> Iterator[None]:
    """Run the block's imports with the collector off, then freeze what exists."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.freeze()

"""Heavy imports with the cyclic garbage collector off.

Importing torch, Ray, MLflow and scikit-learn builds millions of objects, and the collector's
full passes over them while the imports run cost a large share of their time; an import leaves
no cyclic garbage worth a pass. So these imports run with the collector off, and what they
built is then frozen (``gc.freeze``): later collections do not walk it again.
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

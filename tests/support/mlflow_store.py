"""A test's sqlite MLflow store, started from an empty, already migrated copy.

MLflow builds a new sqlite store by running its whole schema migration chain (about a CPU-second
here) in the first process that opens it: a sweep test's driver. Each pytest process migrates
one empty store once and copies it into a test's folder instead; tests that check a store's
first use (the quickstart as shipped, ``ksweep train``) open a missing file as before.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

STORE_FILE = "mlflow.db"
_template: Path | None = None


def _migrated_template() -> Path:
    global _template
    if _template is None:
        from mlflow.tracking import MlflowClient

        path = Path(tempfile.mkdtemp(prefix="ksweep-mlflow-template-")) / STORE_FILE
        MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # creates and migrates
        _template = path
    return _template


def sqlite_store_uri(folder: Path) -> str:
    """``sqlite:///<folder>/mlflow.db``, the file copied from the migrated template when missing."""
    path = Path(folder) / STORE_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_template(), path)
    return f"sqlite:///{path}"

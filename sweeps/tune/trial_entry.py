"""The function Tune ships to a sweep's trial workers: :func:`train_sweep_trial`.

This module imports nothing heavy, so unpickling the trainable in a fresh worker loads no
MLflow, torch or trainers; the first trial imports them, once per worker process (Ray reuses
it for the next trial), with the garbage collector off (:mod:`workers.imports`).
"""

from __future__ import annotations

import functools
import urllib.parse
from typing import TYPE_CHECKING, Any

from workers.imports import heavy_imports

if TYPE_CHECKING:
    from sweeps.spec.trials import TrialConfigs
    from sweeps.tune.trial_context import TrialContext


@functools.cache
def load_training_stack(tracking_uri: str | None = None) -> None:
    """The trainables (MLflow with them), torch and the trainers, once per worker process; with
    a database ``tracking_uri``, MLflow's SQLAlchemy store too (its module and ORM mappers, no
    connection: an unreachable database is the runs' retries' business, not the import's)."""
    with heavy_imports():
        from mlflow.store.db.db_types import DATABASE_ENGINES

        import sweeps.tune.trainable  # noqa: F401
        import workers.cohort.chunked  # noqa: F401
        import workers.cohort.solo  # noqa: F401
        import workers.train  # noqa: F401
        import workers.trial  # noqa: F401

        scheme = urllib.parse.urlparse(tracking_uri or "").scheme.lower()
        if any(scheme.startswith(engine) for engine in DATABASE_ENGINES):
            import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
            from sqlalchemy.orm import configure_mappers

            configure_mappers()


def train_sweep_trial(params: dict[str, Any], *, configs: TrialConfigs,
                      context: TrialContext) -> None:
    """The sweep's Tune function trainable: a cohort of K >= 1 members
    (:func:`sweeps.tune.trainable.train_tune_trial`; a lone trial is a cohort of one)."""
    from sweeps.tune.search_space import MEMBERS, is_cohort
    from workers.tracking.writer_process import worth_a_writer_process

    if is_cohort(params) and worth_a_writer_process(len(params[MEMBERS])):
        # One metric batch per member per epoch: a writer process takes MLflow's store work off
        # this process's GIL. Started first, its own imports of MLflow and the store run beside
        # this process's, not beside the first epoch's training.
        with heavy_imports():
            from workers.tracking.writer import write_in_child_process
        write_in_child_process(tracking_uri=context.tracking_uri)
    load_training_stack(context.tracking_uri)
    from sweeps.tune.trainable import train_tune_trial

    train_tune_trial(params, configs=configs, context=context)

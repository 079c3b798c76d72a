"""A sweep's driver process: ``python -m service.driver SWEEP_ID``.

Started by a launcher (a local process or a Ray Job). It reads the sweep's spec from the
store, runs (or resumes) the Ray Tune driver, and writes progress, per-trial records and
the final state with the report back to the store. It never decides to start: a sweep
that is not ``running`` in the store (cancelled meanwhile, or finished) is left alone.

A database restart under a running driver loses nothing: progress reports that fail are
dropped (the next one carries the same counters), and the driver's start, its final status
and its failure are retried until the store answers again (``service/store/retry.py``).

A sweep extended while its driver runs (``POST /sweeps/{id}/extend``): the driver asks the
store for newer extensions whenever its trials have ended, and stores its final status only
while the sweep holds the extensions it ran; otherwise it runs the new trials and ends again.
"""

from __future__ import annotations

import sys

from sqlalchemy.exc import SQLAlchemyError

from service.settings import get_settings
from service.store.queries import Store
from service.store.retry import store_retrying
from sweeps.plan.budget import build_plan_within_budget
from sweeps.spec import SweepSpec
from sweeps.status import SweepState, SweepStatus
from sweeps.tune.runner import SweepSettings, run_sweep
from sweeps.tune.setup import end_driver_process


class StoreSink:
    """Publishes the driver's progress into the service store. A final status is held back:
    :func:`main` stores it with the report that ``run_sweep`` returns (:meth:`finish`), so the
    report is in the store by the time the sweep reads as ended."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.final: SweepStatus | None = None

    def publish(self, status: SweepStatus) -> None:
        if status.state in (SweepState.SUCCEEDED, SweepState.FAILED):
            self.final = status
            return
        try:
            self.store.publish_status(status)
        except SQLAlchemyError as error:  # a store hiccup must not kill the sweep; next publish retries
            first = str(error).splitlines()[0][:300]
            print(f"ksweep driver: could not record progress: {first}", file=sys.stderr, flush=True)

    def finish(self, status: SweepStatus | None, report: dict | None,
               extension_count: int | None = None) -> bool:
        """The final status (with the report, when the sweep has one), retried through a
        store restart; False when the store did not take it (see
        :meth:`Store.publish_status`)."""
        status = status or self.final
        if status is None:
            return False
        return bool(store_retrying(
            lambda: self.store.publish_status(status, report=report, extension_count=extension_count),
            f"final status of sweep {status.sweep_id}"))


def refresher(store: Store, sweep_id: str):
    """``run_sweep``'s ``refresh``: the sweep's newer spec and extension records, if any."""
    def refresh(known: int) -> tuple[SweepSpec, list[dict]] | None:
        row = store_retrying(lambda: store.get_sweep(sweep_id), f"reading sweep {sweep_id}")
        if row is None or row.state != SweepState.RUNNING or row.extension_count <= known:
            return None
        return SweepSpec.model_validate(row.spec), list(row.extensions or [])

    return refresh


def reusable_sweeps(store: Store, row) -> frozenset[str] | None:
    """The sweeps whose trials ``reuse`` may take: the owner's (own) or every sweep the
    service holds (visible: any caller with read access reads them all)."""
    reuse = (row.spec or {}).get("reuse", "none")
    if reuse == "none":
        return frozenset()
    owner = row.owner if reuse == "own" else None
    return frozenset(store_retrying(lambda: store.sweep_ids(owner=owner), "listing sweeps"))


def init_tracking_store(tracking_uri: str) -> None:
    """Create a sqlite MLflow store's schema under a file lock: two drivers starting at once
    on a fresh ``mlflow.db`` otherwise race in MLflow's own migrations ("table ... already
    exists") and one of them dies."""
    if not tracking_uri.startswith("sqlite:///"):
        return
    from filelock import FileLock
    from mlflow.tracking import MlflowClient

    with FileLock(tracking_uri.removeprefix("sqlite:///") + ".init.lock", timeout=300):
        MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m service.driver SWEEP_ID", file=sys.stderr)
        return 2
    sweep_id = args[0]
    settings = get_settings()
    store = store_retrying(lambda: Store(settings.store_url), "opening the store")
    row = store_retrying(lambda: store.get_sweep(sweep_id), f"reading sweep {sweep_id}")
    if row is None:
        print(f"ksweep driver: no sweep {sweep_id!r} in the store", file=sys.stderr)
        return 2
    if row.state != SweepState.RUNNING:
        print(f"ksweep driver: sweep {sweep_id} is {row.state}, nothing to do", file=sys.stderr)
        return 0
    try:
        spec = SweepSpec.model_validate(row.spec)
        plan = build_plan_within_budget(spec)
    except ValueError as error:  # nothing a restart could mend: fail the sweep at once
        store.finish(sweep_id, SweepState.FAILED.value, error=f"stored spec is invalid: {error}",
                     from_states=(SweepState.RUNNING.value,))
        return 1
    init_tracking_store(settings.mlflow_tracking_uri)
    print(f"ksweep driver: sweep {sweep_id} ({spec.name}), attempt {row.attempts}", flush=True)
    sink = StoreSink(store)
    try:
        while True:
            extensions = list(row.extensions or [])
            outcome = run_sweep(spec, plan, SweepSettings(
                sweep_id=sweep_id, sweep_root=settings.sweep_root,
                tracking_uri=settings.mlflow_tracking_uri, num_cpus=settings.driver_num_cpus,
                ray_address=settings.ray_address, sinks=[sink], mlflow_ui_url=settings.mlflow_ui_url,
                data_root=settings.dataset_root, model_root=settings.resolved_model_root,
                extensions=extensions, refresh=refresher(store, sweep_id),
                reuse_from=reusable_sweeps(store, row), submitted_at=row.created_at,
            ))
            count = len(outcome.report.get("extensions", extensions))
            if sink.finish(outcome.status, outcome.report, extension_count=count):
                break
            row = store_retrying(lambda: store.get_sweep(sweep_id), f"reading sweep {sweep_id}")
            if row is None or row.state != SweepState.RUNNING or row.extension_count <= count:
                break  # cancelled (or ended) under the driver
            # Extended as it ended: run the new trials, then end again.
            spec = SweepSpec.model_validate(row.spec)
            plan = build_plan_within_budget(spec)
    except Exception as error:
        # run_sweep has published the failed status to the sink: store it, then make sure the
        # store says failed even if that status was never published.
        sink.finish(None, None)
        reason = f"{type(error).__name__}: {error}"
        store_retrying(lambda: store.finish(sweep_id, SweepState.FAILED.value, error=reason,
                                            from_states=(SweepState.RUNNING.value,)), f"failing sweep {sweep_id}")
        raise
    finally:
        end_driver_process()
    print(f"ksweep driver: sweep {sweep_id} {outcome.status.state}", flush=True)
    return 0 if outcome.status.state == SweepState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())

"""The API's background loop: starts queued sweeps, watches drivers, restarts dead ones.

At start it reconciles: a running sweep whose driver is alive is simply watched again; one
whose driver died is restarted (the driver resumes from its Tune state) until it has been
started ``1 + max_driver_restarts`` times, after which the sweep fails with the reason.

A Ray head that restarts takes the sweep's driver (a Ray Job on the head) with it: the Jobs API
first does not answer (health ``unknown``: wait, spend nothing), then answers without the job
(``lost``). A head back within ``head_restart_window_s`` of its first silence gets the driver
started again as a new Ray Job of the same attempt (``<id>-h1``, ``-h2``...), which restores the
sweep from its Tune state on the shared sweep root; no restart of the budget is spent. A head
back later, or a job lost while the head never went silent, counts as a driver death.

Several API processes may share one store: each runs this loop, but a pass only runs in the
process holding the store's ``supervisor`` lease (:mod:`service.store.lease`), renewed every
poll and taken over by a standby within ``lease_ttl_s`` when its holder dies.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Row

from service.orchestrator.launchers import DriverHealth, Launcher, head_relaunches
from service.settings import Settings
from service.store.db import SweepRow
from service.store.lease import Lease, new_holder_id
from service.store.queries import Store
from sweeps.status import STATE_TAG, SweepState
from workers.contract import SWEEP_ID_TAG, runs_with_tag_filter

log = logging.getLogger("ksweep.supervisor")
LAUNCHING = "launching"


class Supervisor:
    def __init__(self, settings: Settings, store: Store, launcher: Launcher) -> None:
        self.settings, self.store, self.launcher = settings, store, launcher
        self.lease = Lease(store, new_holder_id(), settings.lease_ttl_s)
        self.leading = False
        # Sweep id -> driver handle of the drivers whose health the last pass could not tell.
        self.unknown_health: dict[str, str] = {}
        # Sweep id -> when (monotonic) its driver's health first turned unknown, until it is
        # known again: how long the head was away when it answers without the driver.
        self.unknown_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Cancels and the loop never act on the same sweep at once.
        self.lock = threading.RLock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ksweep-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.leading:
            self.lease.release()
            self.leading = False

    def lead_and_tick(self) -> bool:
        """Renew (or take) the lease and, holding it, run one pass; False on a standby."""
        leading = self.lease.hold()
        if leading != self.leading:
            log.warning("supervisor %s: %s", self.lease.holder,
                        "took the lease: supervising" if leading else "lost the lease: standing by")
            self.leading = leading
        if leading:
            self.tick()
        return leading

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.lead_and_tick()
            except Exception:  # keep supervising through a store or cluster hiccup
                log.exception("supervisor tick failed")
            self._stop.wait(self.settings.poll_interval_s)

    def tick(self) -> None:
        """One pass: deal with dead drivers, then start queued sweeps while there is room."""
        with self.lock:
            unknown = {}
            running = self.store.sweeps_in_state(SweepState.RUNNING.value)
            for row in running:
                if self._watch(row) == DriverHealth.UNKNOWN:
                    unknown[row.id] = row.driver_handle
            self.unknown_health = unknown
            for gone in set(self.unknown_since) - set(unknown):
                del self.unknown_since[gone]
            room = self.settings.max_concurrent_sweeps - self.store.count_in_state(SweepState.RUNNING.value)
            if room > 0:
                for row in self.store.sweeps_in_state(SweepState.QUEUED.value)[:room]:
                    self._launch(row.id, attempt=1, from_states=(SweepState.QUEUED.value,))

    def _watch(self, row: SweepRow) -> DriverHealth | None:
        handle = row.driver_handle
        if handle and handle != LAUNCHING:
            health = self.launcher.health(row.id, handle)
            if health == DriverHealth.ALIVE:
                return health
            if health == DriverHealth.UNKNOWN:  # ask again next tick; never spend a restart
                log.info("sweep %s: driver %s health unknown; not restarting", row.id, handle)
                self.unknown_since.setdefault(row.id, time.monotonic())
                return health
            if health == DriverHealth.LOST and self._relaunch_after_head_restart(row, handle):
                return health
        fresh = self.store.get_sweep(row.id)  # the driver may have ended the sweep meanwhile
        if fresh is None or fresh.state != SweepState.RUNNING:
            return
        reason = "the API stopped while starting the driver"
        if handle and handle != LAUNCHING:
            reason = self.launcher.exit_reason(row.id, handle)
            # Whatever the dead driver left behind (its local Ray's daemons) goes with it.
            self.launcher.stop(row.id, handle, grace_s=0.0)
        if fresh.attempts <= self.settings.max_driver_restarts:
            log.warning("sweep %s: driver died (%s); restarting it (attempt %d)",
                        row.id, reason.splitlines()[0], fresh.attempts + 1)
            self._launch(row.id, attempt=fresh.attempts + 1, from_states=(SweepState.RUNNING.value,))
        else:
            self.store.finish(row.id, SweepState.FAILED.value, from_states=(SweepState.RUNNING.value,), error=(
                f"the driver died {fresh.attempts} times (KSWEEP_MAX_DRIVER_RESTARTS="
                f"{self.settings.max_driver_restarts}); last: {reason}"))

    def _relaunch_after_head_restart(self, row: SweepRow, handle: str) -> bool:
        """Start a lost driver again without spending a restart, when its head went silent and
        came back within the window; False (a driver death) otherwise."""
        since = self.unknown_since.pop(row.id, None)
        if since is None:  # never silent: not a head restart this process saw
            return False
        away_s = time.monotonic() - since
        if away_s > self.settings.head_restart_window_s:
            log.warning("sweep %s: the Ray head was away %.0f s (KSWEEP_HEAD_RESTART_WINDOW_S=%g): "
                        "its lost driver counts as dead", row.id, away_s,
                        self.settings.head_restart_window_s)
            return False
        fresh = self.store.get_sweep(row.id)
        if fresh is None or fresh.state != SweepState.RUNNING:
            return True
        relaunch = head_relaunches(handle) + 1
        log.warning("sweep %s: the Ray head answered again after %.0f s without driver %s; "
                    "starting it again (attempt %d, start %d after a head restart; no restart spent)",
                    row.id, away_s, handle, fresh.attempts, relaunch)
        self._launch(row.id, attempt=fresh.attempts, relaunch=relaunch,
                     from_states=(SweepState.RUNNING.value,))
        return True

    def _launch(self, sweep_id: str, *, attempt: int, from_states: tuple[str, ...],
                relaunch: int = 0) -> None:
        # Marked running before the process exists: the driver only runs running sweeps, and
        # an API that dies right here restarts it at the next start.
        if not self.store.mark_launched(sweep_id, launcher=self.launcher.name, handle=LAUNCHING,
                                        attempts=attempt, from_states=from_states):
            return
        try:
            handle = self.launcher.launch(sweep_id, attempt, relaunch)
        except (OSError, RuntimeError, ValueError) as error:  # Popen, or the Jobs API refused
            self.store.finish(sweep_id, SweepState.FAILED.value, from_states=(SweepState.RUNNING.value,),
                              error=f"could not start the driver: {type(error).__name__}: {error}")
            return
        self.store.set_driver_handle(sweep_id, handle)
        log.info("sweep %s: driver started (%s, attempt %d)", sweep_id, handle, attempt)

    def cancel(self, row: SweepRow | Row) -> bool:
        """Cancel an active sweep: the store first (so nothing restarts or revives it), then
        the driver and its trials. False when the sweep had already ended."""
        with self.lock:
            if not self.store.finish(row.id, SweepState.CANCELLED.value, error=None):
                return False
            fresh = self.store.get_sweep(row.id)
            handle = fresh.driver_handle if fresh is not None else None
        if handle and handle != LAUNCHING:
            self.launcher.stop(row.id, handle, self.settings.cancel_grace_s)
        if fresh is not None and fresh.experiment_id:
            close_mlflow_runs(self.settings.mlflow_tracking_uri, fresh.experiment_id, row.id)
        return True


def close_mlflow_runs(tracking_uri: str, experiment_id: str, sweep_id: str) -> None:
    """Mark the cancelled sweep's still-running MLflow runs KILLED; finished ones stay as they are."""
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        runs = client.search_runs([experiment_id], filter_string=(
            runs_with_tag_filter(**{SWEEP_ID_TAG: sweep_id}) + " and attributes.status = 'RUNNING'"))
        for run in runs:
            client.set_tag(run.info.run_id, STATE_TAG, SweepState.CANCELLED.value)
            client.set_terminated(run.info.run_id, "KILLED")
    except Exception:  # the sweep is cancelled either way; run states are cosmetic
        log.exception("sweep %s: could not close its MLflow runs", sweep_id)

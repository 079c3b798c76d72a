"""How Tune hears a sweep trial and what its checkpoints hold: the two layouts of
:class:`sweeps.tune.trainable.TuneTrial`.

- :class:`LoneLayout`, a trial of one from a lone Tune config (``resources.cohort_size: 1``, or
  the one trial of a cohort of one): each epoch's metrics with the run id and the run's
  constants (what ASHA and the result grid read, as for any Tune trial); the checkpoint holds
  ``state.pt`` (the trainer's) and ``run.json`` (its run id).
- :class:`CohortLayout`, a cohort of K > 1: the best member value of the sweep's metric and
  the members' progress records (:data:`~sweeps.tune.cohort_results.COHORT_MEMBERS_KEY`); the
  checkpoint holds each running member's ``member_{k}.pt`` and every member's record
  (:data:`~sweeps.tune.cohort_results.MEMBERS_FILE`).

Each layout builds the engine a trial trains (fresh or from its checkpoint), reports an epoch,
and catches Tune up when it restored an older checkpoint's iteration
(:func:`sweeps.tune.state_backup.fill_deleted_checkpoints`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ray import tune

from sweeps.tune.cohort_results import COHORT_MEMBERS_KEY, ENDED, MEMBERS_FILE, progress_record
from sweeps.tune.member_runs import MemberRuns
from sweeps.tune.state_backup import seal_checkpoint
from sweeps.tune.trial_context import TrialContext
from workers.contract import TrainingStatus

if TYPE_CHECKING:
    from workers.cohort.chunked import ChunkedCohort
    from workers.cohort.solo import SoloCohort
    from workers.cohort.trainer import Cohort
    from workers.train.config import TrialConfig

    Engine = Cohort | ChunkedCohort | SoloCohort


class LaidOutTrial(Protocol):
    """What a layout reads and calls of its trial (:class:`sweeps.tune.trainable.TuneTrial`)."""

    context: TrialContext
    member_runs: MemberRuns
    configs: list[TrialConfig]
    records: list[dict[str, Any]]
    running: list[int]
    last: dict[int, dict[str, float]]

    def wait_for_runs(self, engine: Engine, raising: bool = True) -> None: ...

    def settle(self) -> None: ...

    def best(self) -> float: ...

__all__ = ["CHECKPOINT_FILE", "RUN_FILE", "CohortLayout", "LoneLayout"]

CHECKPOINT_FILE = "state.pt"
RUN_FILE = "run.json"


def _checkpoint_folder() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="ksweep-ckpt-")


class LoneLayout:
    """A trial of one, reported as a lone Tune trial (the module doc)."""

    def __init__(self, trial: LaidOutTrial) -> None:
        self.trial = trial
        self.constants: dict[str, float] = {}
        self.ended: str | None = None  # how the run the checkpoint names ended, if FINISHED

    def _engine(self, folder: Path | None) -> SoloCohort:
        from workers.cohort.solo import SoloCohort
        from workers.train import Trainer
        from workers.trial import run_constants

        trainer = Trainer.create(self.trial.configs[0], self.trial.context.cache_root)
        if folder is not None:
            trainer.load_checkpoint(folder / CHECKPOINT_FILE)
        self.constants = run_constants(trainer)
        self.trial.running = [0]
        return SoloCohort(trainer)

    def fresh(self) -> SoloCohort:
        return self._engine(None)

    def restore(self, folder: Path) -> SoloCohort | None:
        """The trainer from ``state.pt`` and its run from ``run.json``; None when the run shows
        a scheduler stopped the trial before the kill (it stays stopped)."""
        run_id = json.loads((folder / RUN_FILE).read_text())["run_id"]
        self.trial.records[0]["run_id"] = run_id
        self.ended = self.trial.member_runs.ended_as(run_id)
        if self.ended == TrainingStatus.STOPPED:
            return None
        return self._engine(folder)

    def run_ended(self, run_id: str) -> bool:
        """Whether the checkpoint's run ended FINISHED (the trial completed under a driver
        killed before Tune recorded that): it is whole, and the trial only replays its last
        epochs for Tune. A run ended otherwise (FAILED by the driver's backstop) is attached
        and goes on."""
        return self.ended is not None

    def _payload(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return {**metrics, "mlflow_run_id": self.trial.records[0]["run_id"], **self.constants}

    def report(self, engine: Engine | None) -> None:
        """The epoch's metrics (``finalize``'s too on the last), with its checkpoint."""
        trial = self.trial
        trial.wait_for_runs(engine)
        member = engine.members[0]
        with _checkpoint_folder() as folder:
            member.trainer.save_checkpoint(Path(folder) / CHECKPOINT_FILE)
            (Path(folder) / RUN_FILE).write_text(json.dumps({"run_id": trial.records[0]["run_id"]}))
            seal_checkpoint(Path(folder))
            trial.settle()  # MLflow holds the epoch before Tune records its checkpoint
            tune.report(self._payload(trial.last[0]), checkpoint=tune.Checkpoint.from_directory(folder))

    def catch_up(self, engine: Engine | None, tune_epoch: int) -> None:
        """Report the epochs after ``tune_epoch`` that the restored checkpoint already holds
        (MLflow logged each before Tune saw it), from the trainer's history, so Tune's
        iteration count matches the epochs again; the last one carries the checkpoint."""
        if engine is None:  # stopped before the kill: nothing more to say
            return
        trainer = engine.members[0].trainer
        for epoch in range(tune_epoch + 1, trainer.epoch + 1):
            metrics = {name: values[epoch - 1] for name, values in trainer.history.items()
                       if len(values) >= epoch}
            if epoch < trainer.epoch:  # ahead of the checkpoint that holds it
                tune.report(self._payload(metrics))
                continue
            self.trial.last[0] = ({**metrics, **trainer.finalize()} if trainer.finished
                                  else metrics)
            self.report(engine)


class CohortLayout:
    """A cohort of K > 1, reported as its members' records (the module doc)."""

    def __init__(self, trial: LaidOutTrial) -> None:
        self.trial = trial

    def _engine(self, folder: Path | None) -> Engine | None:
        from workers.cohort.chunked import open_cohort

        trial = self.trial
        trial.running = [k for k, r in enumerate(trial.records) if r["state"] == TrainingStatus.RUNNING]
        if not trial.running:  # every member ended before the restore: nothing re-runs
            return None
        checkpoints = ({i: folder / f"member_{k}.pt" for i, k in enumerate(trial.running)}
                       if folder is not None else None)
        return open_cohort([trial.configs[k] for k in trial.running], trial.context.cache_root,
                           checkpoints)

    def fresh(self) -> Engine | None:
        return self._engine(None)

    def run_ended(self, run_id: str) -> bool:
        """Whether a running member's run ended under a killed driver (any end: the member only
        replays its last epochs from the checkpoint's exact state, touching nothing in MLflow)."""
        return not self.trial.member_runs.is_running(run_id)

    def restore(self, folder: Path) -> Engine | None:
        """The members' records from the checkpoint; the runs of members that ended before a
        kill, which it left RUNNING, ended; the cohort of those still running."""
        trial = self.trial
        trial.records = json.loads((folder / MEMBERS_FILE).read_text())
        for record in trial.records:
            if record["state"] in ENDED:
                trial.member_runs.close_leftover(record)
        return self._engine(folder)

    def report(self, engine: Engine | None) -> None:
        """One ``tune.report`` for the cohort, with every running member's checkpoint and
        every member's record (None: every member ended, records only)."""
        trial = self.trial
        if engine is not None:
            trial.wait_for_runs(engine)
        with _checkpoint_folder() as folder:
            for position, member in enumerate(engine.members if engine is not None else []):
                if member.status == TrainingStatus.RUNNING:
                    engine.save_checkpoint(member, Path(folder) / f"member_{trial.running[position]}.pt")
            (Path(folder) / MEMBERS_FILE).write_text(json.dumps(trial.records))
            seal_checkpoint(Path(folder))
            trial.settle()  # MLflow holds every epoch before Tune records the checkpoint
            tune.report({trial.context.metric: trial.best(), "cohort_size": float(len(trial.records)),
                         COHORT_MEMBERS_KEY: json.dumps([progress_record(r) for r in trial.records])},
                        checkpoint=tune.Checkpoint.from_directory(folder))

    def catch_up(self, engine: Engine | None, tune_epoch: int) -> None:
        """One report brings Tune's copy of the records up to date."""
        self.report(engine)

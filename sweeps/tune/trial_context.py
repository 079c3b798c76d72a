"""What the driver hands every trial of a sweep besides its params: :class:`TrialContext`.

Pure Python, no import beyond the standard library: Tune pickles it with the trainable into
each trial worker (:mod:`sweeps.tune.trial_entry` stays light to unpickle).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrialContext:
    """The sweep's places and choices every trial of it reads.

    Attributes:
        tracking_uri: the MLflow tracking store the trial runs are written to.
        experiment_name: the MLflow experiment of the sweep's runs.
        sweep_id: the sweep's id (the ``ksweep.sweep_id`` tag of every run).
        parent_run_id: the sweep's parent run; the trial runs are its children.
        cache_root: where trials cache what they share (learned bases, datasets' tensors).
        metric: the sweep's primary objective metric, which a cohort reports to Tune as its own.
        mode: ``max`` or ``min``, for ``metric``.
        trial_plots: each trial run's five PNGs at its end (the spec's ``tracking.trial_plots``).
    """

    tracking_uri: str
    experiment_name: str
    sweep_id: str
    parent_run_id: str | None
    cache_root: str
    metric: str
    mode: str
    trial_plots: bool = False

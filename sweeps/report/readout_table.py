"""From trial outcomes to per-row, per-seed read-outs: what the report's statistics consume.

A trial's read-outs are the values at the checkpoint val chose, logged by the worker as
``selected/{split}/{name}`` and ``selected/{split}/{kind}/{name}`` (with ``selected/epoch``).
The curve read-outs (``nmi_auc``, ``epochs_to_nmi90[_censored]``) are logged once per trial
without the prefix and read beside them. FALLBACK (runs from before the trial protocol): a
trial without any ``selected/`` metric is read at its final epoch from ``{split}/{name}``,
and the report says so in its words (``readout_source = final_epoch``).

A trial that stands in several requested rows (see :mod:`sweeps.plan.build`) gives its values to
every one of them, so every row of the grid has its numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from objectives.units import effective_beta, elbo_beta, kl_weight
from sweeps.plan.build import SweepPlan, row_label, trial_key
from sweeps.plan.identity import objective_key
from sweeps.spec import SweepSpec
from sweeps.status import TrialState
from workers.contract import (
    EPOCHS_TO_NMI,
    EPOCHS_TO_NMI_CENSORED,
    NMI_AUC,
    SELECTED_EPOCH,
    SELECTED_PREFIX,
    SPLITS,
    TEST,
    TRAIN_TARGET_LENGTH_PARAM,
    VAL,
)

__all__ = ["RowResult", "TrialOutcome", "expand_outcomes", "trial_readouts"]

ALL_KINDS = "all"
UNFINISHED = "unfinished"  # the exclusion count of trials neither done, stopped nor failed
_SPLITS = (VAL, TEST)  # the report reads the splits no trial trains on
# split, kind, name: the kind segment is a synthetic kind or a dataset's group name
# (sanitized to these characters by the dataset source).
_NAME = rf"({'|'.join(SPLITS)})/(?:([A-Za-z0-9_.-]+)/)?([^/]+)$"
_SELECTED = re.compile("^" + re.escape(SELECTED_PREFIX) + _NAME)
_PLAIN = re.compile("^" + _NAME)
# Trial-level read-outs of the whole curve (workers.readouts.speed): logged once, unprefixed.
_CURVE_READOUTS = frozenset({NMI_AUC, EPOCHS_TO_NMI, EPOCHS_TO_NMI_CENSORED})


@dataclass
class TrialOutcome:
    """One trial's final state as the report needs it."""

    trial_id: str
    params: dict[str, Any]  # alpha, loss_stack, model, seed (+ beta, free_bits, target_rate when swept)
    state: str  # done | failed | stopped | running | pending
    final: dict[str, float]  # last reported metrics (selected/* among them once logged)
    history: dict[str, list[float]]  # per-epoch values of the report metrics
    epochs: int = 0
    error: str | None = None
    run_id: str | None = None
    trial_hash: str | None = None  # the content hash its run is tagged with (sweeps.plan.identity)
    reused_from: str | None = None  # the sweep whose run it is, when reused from another sweep


@dataclass
class RowResult:
    """One requested row at one seed: its configuration and read-outs.

    ``values`` maps ``(split, kind, metric)`` to the value (None when missing or not finite);
    ``beta`` and ``free_bits`` are always numbers (the stack's own kl values when not swept);
    ``target_rate`` is the swept target rate, else the stack's own kl ``target_rate`` (None: no
    rate control);
    ``beta_elbo`` is the row's beta in ELBO units, from the trial's c_base and train mean
    target length (None for a trial that did not log them).
    """

    alpha: float
    loss_stack: str
    model: str
    seed: int
    beta: float | None
    free_bits: float | None
    beta_effective: float | None
    values: dict[tuple[str, str, str], float | None]
    trial_id: str
    source: str  # selected | final_epoch
    selected_epoch: int | None = None
    shared_with: list[str] = field(default_factory=list)
    beta_elbo: float | None = None  # beta in ELBO units (objectives.units); None when not logged
    target_rate: float | None = None  # nats of E[KL] per example the trial trained to (None: off)

    def config(self) -> dict[str, Any]:
        """Everything that identifies the row except its seed."""
        return {"alpha": self.alpha, "loss_stack": self.loss_stack, "model": self.model,
                "beta": self.beta, "free_bits": self.free_bits, "target_rate": self.target_rate}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def trial_readouts(final: dict[str, Any], metrics: Sequence[str]
                   ) -> tuple[dict[tuple[str, str, str], float | None], str]:
    """``(split, kind, metric) -> value`` of one trial, and where the values came from.

    A key present with a NaN value maps to None (and is counted by the statistics); a key
    absent is left out.
    """
    wanted = set(metrics)
    selected = any(key.startswith(SELECTED_PREFIX) for key in final)
    pattern, source = (_SELECTED, "selected") if selected else (_PLAIN, "final_epoch")
    values: dict[tuple[str, str, str], float | None] = {}
    for key, value in final.items():
        match = pattern.match(key)
        if selected and match is None:
            curve = _PLAIN.match(key)
            match = curve if curve and curve.group(3) in _CURVE_READOUTS else None
        if match and match.group(1) in _SPLITS and match.group(3) in wanted:
            values[(match.group(1), match.group(2) or ALL_KINDS, match.group(3))] = _finite(value)
    return values, source


def _kl_values(spec: SweepSpec, alpha: float, stack: str, beta: float | None,
               free_bits: float | None, target_rate: float | None):
    resolved = spec.stack_spec(stack, alpha, beta, free_bits, target_rate)
    kl = resolved.resolved_terms().get("kl")
    own_fb = None if kl is None else float(kl.options.get("free_bits", 0.0))
    rate = None if kl is None else _finite(kl.options.get("target_rate"))
    return resolved, kl_weight(resolved), own_fb, rate


def _usable(outcome: TrialOutcome) -> bool:
    # Stopped early by its own val-loss rule (it logged the epoch it chose): usable. Stopped
    # by the scheduler (ASHA) before the end: not comparable with trials that ran.
    if outcome.state == TrialState.DONE:
        return True
    return outcome.state == TrialState.STOPPED and SELECTED_EPOCH in outcome.final


def _rows_of(spec: SweepSpec, plan: SweepPlan) -> dict[tuple, list[dict[str, Any]]]:
    """A grid's requested rows by the key of the trial that stands in them: the objective key
    (:mod:`sweeps.plan.identity`) under dedup, so a trial that ran before the sweep grew (its
    params those of its first row then) stands in every row of its objective now."""
    if spec.search.kind != "grid":
        return {}
    if not spec.search.dedup:
        return plan.rows_of_trial()
    rows: dict[tuple, list[dict[str, Any]]] = {}
    for row in plan.rows:
        rows.setdefault(objective_key(spec, row), []).append(row)
    return rows


def expand_outcomes(spec: SweepSpec, plan: SweepPlan, outcomes: Iterable[TrialOutcome],
                    metrics: Sequence[str]) -> tuple[list[RowResult], dict[str, int]]:
    """Every requested row at every seed with a usable trial, and the exclusion counts.

    Returns:
        rows, and ``{"failed": n, "stopped": n, "unfinished": n}`` of the trials excluded.
    """
    rows_of = _rows_of(spec, plan)
    by_objective = spec.search.kind == "grid" and spec.search.dedup
    results: list[RowResult] = []
    excluded = {TrialState.FAILED.value: 0, TrialState.STOPPED.value: 0, UNFINISHED: 0}
    for outcome in outcomes:
        if not _usable(outcome):
            state = outcome.state if outcome.state in excluded else UNFINISHED
            excluded[state] += 1
            continue
        values, source = trial_readouts(outcome.final, metrics)
        c_base = _finite(outcome.final.get("c_base", outcome.params.get("c_base")))
        length = _finite(outcome.final.get(TRAIN_TARGET_LENGTH_PARAM,
                                           outcome.params.get(TRAIN_TARGET_LENGTH_PARAM)))
        selected_epoch = _finite(outcome.final.get(SELECTED_EPOCH))
        key = objective_key(spec, outcome.params) if by_objective else trial_key(outcome.params)
        members = rows_of.get(key) or [outcome.params]
        labels = [row_label(row) for row in members] if len(members) > 1 else []
        for row in members:
            alpha, stack = float(row["alpha"]), str(row["loss_stack"])
            beta = None if row.get("beta") is None else float(row["beta"])
            free_bits = None if row.get("free_bits") is None else float(row["free_bits"])
            rate = _finite(None if row.get("target_rate") in (None, "", "None")
                           else float(row["target_rate"]))  # a tag's text, or NaN when off
            resolved, nominal_beta, own_fb, own_rate = _kl_values(spec, alpha, stack, beta,
                                                                  free_bits, rate)
            results.append(RowResult(
                alpha=alpha, loss_stack=stack, model=str(row["model"]), seed=int(row["seed"]),
                beta=nominal_beta, free_bits=free_bits if free_bits is not None else own_fb,
                beta_effective=None if c_base is None else effective_beta(resolved, c_base),
                values=values, trial_id=outcome.trial_id, source=source,
                selected_epoch=None if selected_epoch is None else int(selected_epoch),
                shared_with=[label for label in labels if label != row_label(row)],
                beta_elbo=None if c_base is None or length is None
                else elbo_beta(resolved, c_base, length),
                target_rate=own_rate,
            ))
    return results, excluded

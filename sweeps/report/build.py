"""The sweep report (report.json, docs/science/index.md): cells, contrasts, best, collapse beta, words.

- ``cells``: per (alpha, loss_stack, model, beta, free_bits, kind, metric, split): mean,
  clipped Student t 95% interval over seeds, n, per-seed values (NaN counted in ``n_nan``).
- ``contrasts``: paired by seed at matched effective beta (:mod:`sweeps.report.contrasts`).
- ``best``: one per (model, beta, free_bits), chosen on val, its test value beside it;
  never "the best beta" (the smallest beta always wins on NMI).
- ``collapse``: per stack, the largest beta whose mean val NMI >= the threshold.
- ``latent_use``: per cell, test KL, I(x; z), active units, AMI and NMI beside their chance
  level, and whether the latent is in use (:mod:`sweeps.report.latent_use`).
- ``limitations``: what the report cannot claim, in words.

Everything is computed from the trials' params and final metrics, so the same report can
be recomputed from the MLflow child runs alone.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sweeps.plan.build import SEARCH_AXES, SweepPlan, build_plan
from sweeps.report.contrasts import build_contrasts
from sweeps.report.growth import (
    growth_limitations,
    mark_growth,
    primary_eligibility,
    report_extensions,
)
from sweeps.report.latent_use import USE_READOUTS, latent_limitations, latent_use
from sweeps.report.plots import write_report_plots
from sweeps.report.power import power_section
from sweeps.report.predictions import mark_changed_predictions, prediction_section
from sweeps.report.rates import (
    RATE_READOUTS,
    SELECTED_MULTIPLIER,
    annotate_credit,
    credit_words,
    rate_limitations,
    rate_table,
    rd_plane,
    trained_options,
)
from sweeps.report.readout_table import (
    ALL_KINDS,
    UNFINISHED,
    RowResult,
    TrialOutcome,
    expand_outcomes,
)
from sweeps.report.statistics import MIN_PAIRS_FOR_CLAIM, mean_interval, metric_range
from sweeps.report.text import report_markdown
from sweeps.report.training_sections import (
    context_free_prior,
    data_section,
    schedule_overruns,
    selection_section,
)
from sweeps.spec import SweepSpec
from sweeps.status import TrialState
from workers.contract import LATENT_METRICS, NMI_AUC

__all__ = ["TrialOutcome", "build_report", "metric_mode", "report_markdown", "summary_metrics",
           "write_report_plots"]

COLLAPSE_METRIC = "latent_nmi"  # the read-out whose fall over beta the collapse table finds
BEST_METRIC_PREFIX = "best/"  # the summary metrics of the best cell, on the parent run
_MAXIMISED = (*LATENT_METRICS, NMI_AUC)  # latent recovery and its speed: higher is better
_CONFIG = tuple(axis for axis in SEARCH_AXES if axis != "seed")  # a cell: every axis but the seed


def metric_mode(metric: str) -> str:
    """'max' for latent recovery read-outs, 'min' for losses and everything else."""
    return "max" if metric.rsplit("/", 1)[-1] in _MAXIMISED else "min"


def _sort_key(config: tuple) -> tuple:
    return tuple((0, "") if v is None else (1, v) if isinstance(v, str) else (1, f"{v:020.9f}")
                 for v in config)


def build_cells(rows: Sequence[RowResult], epochs: int | None = None) -> list[dict[str, Any]]:
    """One cell per configuration, kind, metric and split, over the seeds; ``last_epoch``: how
    many of the cell's seeds chose their last epoch (the ``epochs`` budget; None if not given)."""
    groups: dict[tuple, dict[int, float | None]] = defaultdict(dict)
    last: dict[tuple, set[int]] = defaultdict(set)
    effective: dict[tuple, list[float]] = defaultdict(list)
    in_elbo_units: dict[tuple, list[float]] = defaultdict(list)
    shared: dict[tuple, list[str]] = {}
    for row in rows:
        config = tuple(getattr(row, key) for key in _CONFIG)
        if row.beta_effective is not None:
            effective[config].append(row.beta_effective)
        if row.beta_elbo is not None:
            in_elbo_units[config].append(row.beta_elbo)
        if row.shared_with:
            shared[config] = row.shared_with
        if epochs is not None and row.selected_epoch is not None and row.selected_epoch >= epochs:
            last[config].add(row.seed)
        for (split, kind, metric), value in row.values.items():
            groups[(config, split, kind, metric)][row.seed] = value
    cells = []
    for (config, split, kind, metric) in sorted(groups, key=lambda k: (_sort_key(k[0]), *k[1:])):
        by_seed = groups[(config, split, kind, metric)]
        seeds = sorted(by_seed)
        interval = mean_interval([by_seed[s] for s in seeds], metric_range(metric))
        betas, elbo = effective.get(config), in_elbo_units.get(config)
        cells.append({
            **dict(zip(_CONFIG, config, strict=True)),
            "beta_effective": sum(betas) / len(betas) if betas else None,
            "beta_elbo": sum(elbo) / len(elbo) if elbo else None,
            "kind": kind, "metric": metric, "split": split,
            "mean": interval.mean, "ci_low": interval.ci_low, "ci_high": interval.ci_high,
            "n": interval.n, "n_nan": interval.n_nan, "seeds": seeds, "values": interval.values,
            "shared_with": shared.get(config, []),
            "last_epoch": None if epochs is None else len(last[config]),
        })
    return cells


def _cell_index(cells: Sequence[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    return {(tuple(c[k] for k in _CONFIG), c["split"], c["kind"], c["metric"]): c for c in cells}


def _test_beside(index, config: tuple, metric: str, split: str) -> dict[str, Any] | None:
    cell = index.get((config, split, ALL_KINDS, metric))
    if cell is None:
        return None
    return {k: cell[k] for k in ("mean", "ci_low", "ci_high", "n", "seeds", "values")}


def choose_best(cells: Sequence[dict[str, Any]], metric: str, split: str) -> list[dict[str, Any]]:
    """Per (model, beta, free_bits): the (alpha, stack) with the best mean val ``metric``."""
    mode = metric_mode(metric)
    index = _cell_index(cells)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for cell in cells:
        if cell["split"] == "val" and cell["kind"] == ALL_KINDS and cell["metric"] == metric \
                and cell["mean"] is not None:
            groups[(cell["model"], cell["beta"], cell["free_bits"], cell["target_rate"])].append(cell)
    best = []
    for (model, beta, free_bits, rate), members in sorted(groups.items(),
                                                          key=lambda i: _sort_key(i[0])):
        pick = (max if mode == "max" else min)(members, key=lambda c: c["mean"])
        ties = [f"{c['loss_stack']}@alpha={c['alpha']:g}" for c in members
                if c is not pick and c["mean"] == pick["mean"]]
        config = tuple(pick[k] for k in _CONFIG)
        best.append({
            "model": model, "beta": beta, "free_bits": free_bits, "target_rate": rate,
            "metric": metric, "mode": mode,
            "selected": {"alpha": pick["alpha"], "loss_stack": pick["loss_stack"]},
            "val": {"mean": pick["mean"], "n": pick["n"]}, "ties_on_val": ties,
            "split": split, "test": _test_beside(index, config, metric, split),
        })
    return best


def collapse_betas(cells: Sequence[dict[str, Any]], threshold: float, split: str
                   ) -> list[dict[str, Any]]:
    """Per (stack, alpha, model, free_bits) over >= 2 betas: the largest beta with mean val
    NMI >= ``threshold`` (selected on val), its effective beta, and its test NMI beside it."""
    index = _cell_index(cells)
    curves: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for cell in cells:
        if cell["split"] == "val" and cell["kind"] == ALL_KINDS and cell["metric"] == \
                COLLAPSE_METRIC and cell["beta"] is not None:
            curves[(cell["loss_stack"], cell["alpha"], cell["model"], cell["free_bits"],
                    cell["target_rate"])].append(cell)
    out = []
    for (stack, alpha, model, free_bits, rate), members in sorted(curves.items(),
                                                                  key=lambda i: _sort_key(i[0])):
        if len({c["beta"] for c in members}) < 2:
            continue
        members.sort(key=lambda c: c["beta"])
        above = [c for c in members if c["mean"] is not None and c["mean"] >= threshold]
        chosen = above[-1] if above else None
        if chosen is None:
            status = f"val NMI < {threshold:g} at every beta (collapse beta < {members[0]['beta']:g})"
        elif chosen is members[-1]:
            status = f"censored: val NMI >= {threshold:g} at every beta up to the largest"
        else:
            status = "within the grid"
        config = None if chosen is None else tuple(chosen[k] for k in _CONFIG)
        out.append({
            "loss_stack": stack, "alpha": alpha, "model": model, "free_bits": free_bits,
            "target_rate": rate,
            "threshold": threshold, "collapse_beta": None if chosen is None else chosen["beta"],
            "collapse_beta_effective": None if chosen is None else chosen["beta_effective"],
            "collapse_beta_elbo": None if chosen is None else chosen["beta_elbo"],
            "status": status, "split": split,
            "test": None if config is None else _test_beside(index, config, COLLAPSE_METRIC, split),
        })
    return out


def _limitations(rows, cells, contrasts, excluded, source, split, seeds, epochs) -> list[str]:
    words = []
    if source != "selected":
        words.append("FALLBACK: the trials logged no selected/* read-outs; each trial is read "
                     "at its final epoch (no early stopping chose a checkpoint).")
    if split != "test":
        words.append("No test split was logged: every table shows val, the split that "
                     "selected. These numbers are not held-out estimates.")
    if seeds < MIN_PAIRS_FOR_CLAIM:
        words.append(f"{seeds} seed(s): fewer than {MIN_PAIRS_FOR_CLAIM}, so no contrast has a "
                     "p-value and the report makes no claim.")
    dropped = sum(excluded.values())
    if dropped:
        words.append(f"Excluded trials: {excluded[TrialState.FAILED]} failed, "
                     f"{excluded[TrialState.STOPPED]} stopped early by the scheduler, "
                     f"{excluded[UNFINISHED]} unfinished; "
                     "their seeds are missing from the cells (see n).")
    nan_cells = [c for c in cells if c["n_nan"]]
    if nan_cells:
        words.append(f"{sum(c['n_nan'] for c in nan_cells)} NaN value(s) in {len(nan_cells)} "
                     "cell(s): counted in n_nan, left out of means and intervals.")
    last = {r.trial_id for r in rows if r.selected_epoch is not None and r.selected_epoch >= epochs}
    if last:
        words.append(f"{len(last)} trial(s) chose their last epoch ({epochs}): their curves may "
                     "not have converged.")
    primary = [c for c in contrasts if c["family"] == "primary" and c["n_pairs"]]
    open_ = [c for c in primary if c["ci_low"] is not None and c["ci_low"] <= 0 <= c["ci_high"]]
    if open_:
        words.append(f"{len(open_)} of {len(primary)} primary contrast interval(s) include 0: "
                     "no difference can be claimed there.")
    if any(r.shared_with for r in rows):
        words.append("Shared trials (one objective standing in several rows) report their "
                     "kappa diagnostics at the alpha of the row that ran.")
    return words


def extendable(spec: SweepSpec) -> bool:
    """Whether ``ksweep extend`` can add seeds (:mod:`sweeps.plan.growth` refuses Optuna and ASHA)."""
    return spec.search.kind != "optuna" and spec.scheduler.kind != "asha"


def _multipliers(rows: Sequence[RowResult], outcomes: Sequence[TrialOutcome]
                 ) -> dict[tuple, list[float]]:
    """Per configuration, each seed's rate-control multiplier at its selected checkpoint."""
    final = {o.trial_id: o.final for o in outcomes}
    out: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        value = final.get(row.trial_id, {}).get(SELECTED_MULTIPLIER)
        if isinstance(value, int | float) and math.isfinite(value):
            out[tuple(getattr(row, key) for key in _CONFIG)].append(float(value))
    return out


def build_report(spec: SweepSpec, sweep_id: str, outcomes: Iterable[TrialOutcome],
                 plan: SweepPlan | None = None,
                 extensions: Sequence[dict[str, Any]] = (),
                 predictions: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON report of a finished (or partly finished) sweep; ``extensions``: the records
    of a grown sweep's extensions (:mod:`sweeps.report.growth`); ``predictions``: the
    predictions as recorded when its first segment started (:mod:`sweeps.report.predictions`;
    None: the spec's, without a submission time)."""
    outcomes = list(outcomes)
    plan = plan or build_plan(spec)
    # The latent-use read-outs are read whatever analysis.metrics lists: the gate needs them.
    read = list(dict.fromkeys((*spec.analysis.metrics, *USE_READOUTS, *RATE_READOUTS)))
    rows, excluded = expand_outcomes(spec, plan, outcomes, read)
    source = "selected" if rows and all(r.source == "selected" for r in rows) else "final_epoch"
    split = "test" if any(key[0] == "test" for r in rows for key in r.values) else "val"
    cells = build_cells(rows, spec.epochs_per_trial())
    trained: dict[tuple, dict[str, Any]] = {}
    for cell in cells:  # what each cell trained with: the same for every kind, metric, split
        config = tuple(cell[key] for key in _CONFIG)
        if config not in trained:
            trained[config] = trained_options(spec, cell)
        cell.update(trained[config])
    contrasts = build_contrasts(spec, rows, split, primary_eligibility(extensions))
    declared = prediction_section(spec, predictions)
    changed = mark_changed_predictions(contrasts, declared, spec.analysis.metric)
    mark_growth(contrasts, extensions)
    reused = [o for o in outcomes if o.reused_from]
    counts: dict[str, int] = defaultdict(int)
    for outcome in outcomes:
        counts[outcome.state] += 1
    seeds = len({r.seed for r in rows})
    use = latent_use(cells, split, spec.analysis.latent_in_use_nats)
    annotate_credit(use, cells)
    rates = rate_table(cells, split, _multipliers(rows, outcomes))
    return {
        "sweep_id": sweep_id, "name": spec.name,
        "objective": {"metric": spec.primary_metric, "mode": spec.primary_mode},
        "analysis": spec.analysis.model_dump(mode="json"),
        "split": split, "readout_source": source,
        "dedup": {"trials_requested": plan.trials_requested, "trials_run": plan.trial_count,
                  "trials_saved_by_dedup": plan.trials_saved_by_dedup,
                  "trials_reused": len(reused)},
        "cells": cells, "contrasts": contrasts,
        "best": choose_best(cells, spec.analysis.metric, split),
        "collapse": collapse_betas(cells, spec.analysis.collapse_threshold, split),
        "counts": dict(counts), "excluded": excluded,
        "limitations": schedule_overruns(spec, plan, outcomes)
        + _limitations(rows, cells, contrasts, excluded, source, split, seeds, spec.epochs_per_trial())
        + latent_limitations(cells, use) + context_free_prior(spec)
        + growth_limitations(contrasts, extensions) + changed + rate_limitations(rates)
        + credit_words(cells),
        "latent_use": use,
        "rates": rates,
        "rd_plane": rd_plane(cells, split),
        "selection": selection_section(spec),
        "predictions": declared,
        "power": power_section(contrasts, spec.analysis.resolved_min_effect(),
                               {sweep_id: spec.seed_list()}, extendable(spec)),
        "data": data_section(spec),
        "extensions": report_extensions(extensions),
        "reused": [{"trial_id": o.trial_id, "sweep_id": o.reused_from, "mlflow_run_id": o.run_id,
                    "trial_hash": o.trial_hash} for o in sorted(reused, key=lambda o: o.trial_id)],
        "trials": [
            {"trial_id": o.trial_id, **o.params, **trained_options(spec, o.params),
             "state": o.state, "epochs": o.epochs,
             "error": o.error, "mlflow_run_id": o.run_id, "trial_hash": o.trial_hash,
             "reused_from": o.reused_from}
            for o in sorted(outcomes, key=lambda o: o.trial_id)
        ],
    }


def summary_metrics(report: dict[str, Any]) -> dict[str, float]:
    """Parent-run metrics: each best's test value and every all-kinds cell of the metric."""
    metric, split = report["analysis"]["metric"], report["split"]
    values: dict[str, float] = {}
    for best in report["best"]:
        if best["test"] and best["test"]["mean"] is not None:
            beta = "" if best["beta"] is None else f"/beta_{best['beta']:g}"
            beta += "" if best.get("target_rate") is None else f"/rate_{best['target_rate']:g}"
            values[f"{BEST_METRIC_PREFIX}{split}/{metric}/{best['model']}{beta}"] = best["test"]["mean"]
    for cell in report["cells"]:
        if (cell["split"], cell["kind"], cell["metric"]) == (split, ALL_KINDS, metric) and \
                cell["mean"] is not None:
            beta = "" if cell["beta"] is None else f"/beta_{cell['beta']:g}"
            beta += "" if cell.get("target_rate") is None else f"/rate_{cell['target_rate']:g}"
            values[f"final/{split}/{metric}/{cell['loss_stack']}/{cell['model']}"
                   f"/alpha_{cell['alpha']:g}{beta}"] = cell["mean"]
    return values

"""The sweep report: alpha x loss_stack x model, each final val metric as mean and 95% CI."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy import stats as scipy_stats

REPORT_METRICS = (
    "val/latent_nmi", "val/latent_ari", "val/mutual_info", "val/active_units", "val/loss",
    "val/recon_uniform", "val/recon_token_weighted", "val/recon_ncc", "val/kl", "val/kappa_mean",
    "val/kappa_p90", "val/cv2_mean",
)
GROUP_KEYS = ("alpha", "loss_stack", "model")


@dataclass
class TrialOutcome:
    """One trial's final state as the report needs it."""

    trial_id: str
    params: dict[str, Any]  # alpha, loss_stack, model, seed
    state: str  # done | failed | stopped | running | pending
    final: dict[str, float]  # last reported metrics
    history: dict[str, list[float]]  # per-epoch values of the report metrics
    epochs: int = 0
    error: str | None = None
    run_id: str | None = None


def mean_ci95(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean and the half-width of a Student-t 95% interval (NaN with fewer than 2 values)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, 0
    mean = statistics.fmean(finite)
    if len(finite) < 2:
        return mean, math.nan, 1
    half = scipy_stats.t.ppf(0.975, len(finite) - 1) * statistics.stdev(finite) / math.sqrt(len(finite))
    return mean, float(half), len(finite)


def _clean(value: float) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def build_report(
    spec_name: str, sweep_id: str, outcomes: Iterable[TrialOutcome], metric: str, mode: str
) -> dict[str, Any]:
    """The JSON report: rows per (alpha, loss_stack, model), the best configuration, trials."""
    outcomes = list(outcomes)
    groups: dict[tuple, list[TrialOutcome]] = defaultdict(list)
    for outcome in outcomes:
        if outcome.state in ("done", "stopped"):
            key = tuple(outcome.params[k] for k in GROUP_KEYS)
            groups[key].append(outcome)
    rows = []
    for key in sorted(groups, key=lambda k: (float(k[0]), str(k[1]), str(k[2]))):
        members = groups[key]
        row: dict[str, Any] = dict(zip(GROUP_KEYS, key, strict=True))
        row["alpha"] = float(row["alpha"])
        row["n_seeds"] = len(members)
        row["seeds"] = sorted(int(m.params["seed"]) for m in members)
        for name in REPORT_METRICS:
            mean, half, _ = mean_ci95([m.final.get(name, math.nan) for m in members])
            row[f"{name}_mean"], row[f"{name}_ci95"] = _clean(mean), _clean(half)
        rows.append(row)
    best = None
    scored = [r for r in rows if r.get(f"{metric}_mean") is not None]
    if scored:
        pick = max if mode == "max" else min
        best_row = pick(scored, key=lambda r: r[f"{metric}_mean"])
        best = {k: best_row[k] for k in (*GROUP_KEYS, "n_seeds")}
        best.update({"metric": metric, "mode": mode, "value": best_row[f"{metric}_mean"],
                     "ci95": best_row[f"{metric}_ci95"]})
    counts = defaultdict(int)
    for outcome in outcomes:
        counts[outcome.state] += 1
    return {
        "sweep_id": sweep_id,
        "name": spec_name,
        "objective": {"metric": metric, "mode": mode},
        "metrics": list(REPORT_METRICS),
        "rows": rows,
        "best": best,
        "counts": dict(counts),
        "trials": [
            {"trial_id": o.trial_id, **o.params, "state": o.state, "epochs": o.epochs,
             "error": o.error, "mlflow_run_id": o.run_id,
             "final": {k: _clean(v) for k, v in o.final.items() if k in REPORT_METRICS}}
            for o in sorted(outcomes, key=lambda o: o.trial_id)
        ],
    }


def _fmt(mean: float | None, half: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f}" if half is None else f"{mean:.3f} ± {half:.3f}"


def report_markdown(report: Mapping[str, Any], metrics: Sequence[str] | None = None) -> str:
    """The comparison table as Markdown (what `ksweep report` prints and report.md holds)."""
    metrics = list(metrics or ("val/latent_nmi", "val/latent_ari", "val/recon_ncc", "val/kappa_mean"))
    lines = [f"# Sweep {report['name']} ({report['sweep_id']})", ""]
    objective = report["objective"]
    lines.append(f"Objective: {objective['metric']} ({objective['mode']}). "
                 f"Trials: {', '.join(f'{k} {v}' for k, v in sorted(report['counts'].items()))}.")
    lines.append("Cells: mean ± 95% CI half-width over seeds (Student t; no interval for one seed).")
    lines.append("")
    header = ["alpha", "loss_stack", "model", "seeds", *metrics]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    for row in report["rows"]:
        cells = [f"{row['alpha']:g}", row["loss_stack"], row["model"], str(row["n_seeds"])]
        cells += [_fmt(row.get(f"{m}_mean"), row.get(f"{m}_ci95")) for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    best = report.get("best")
    lines.append("")
    if best:
        lines.append(f"Best: alpha {best['alpha']:g}, {best['loss_stack']}, {best['model']}: "
                     f"{best['metric']} = {_fmt(best['value'], best['ci95'])}")
    else:
        lines.append("Best: no trial finished with the objective metric.")
    return "\n".join(lines) + "\n"


def write_report_plots(report: Mapping[str, Any], outcomes: Sequence[TrialOutcome], folder: Path) -> list[Path]:
    """PNG plots: kappa_mean and latent_nmi against alpha, and the val curves per alpha."""
    # matplotlib and torch load only here (the driver), never for `ksweep report`.
    import matplotlib

    from workers.plots import plot_metric_against_alpha

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric, filename in (("val/kappa_mean", "kappa_mean_vs_alpha.png"),
                             ("val/latent_nmi", "latent_nmi_vs_alpha.png"),
                             (report["objective"]["metric"], "objective_vs_alpha.png")):
        rows = [dict(row, loss_stack=f"{row['loss_stack']} / {row['model']}") for row in report["rows"]]
        paths.append(plot_metric_against_alpha(rows, metric, folder / filename))
    metric = report["objective"]["metric"]
    figure, axes = plt.subplots(figsize=(8, 5))
    by_alpha: dict[float, list[TrialOutcome]] = defaultdict(list)
    for outcome in outcomes:
        if outcome.history.get(metric):
            by_alpha[float(outcome.params["alpha"])].append(outcome)
    colours = plt.cm.viridis([i / max(1, len(by_alpha) - 1) for i in range(len(by_alpha))])
    for colour, alpha in zip(colours, sorted(by_alpha), strict=False):
        for index, outcome in enumerate(by_alpha[alpha]):
            values = outcome.history[metric]
            axes.plot(range(1, len(values) + 1), values, color=colour, alpha=0.8,
                      label=f"alpha {alpha:g}" if index == 0 else None)
    axes.set_xlabel("epoch")
    axes.set_ylabel(metric)
    axes.set_title(f"{metric} per trial, coloured by alpha")
    if by_alpha:
        axes.legend()
    path = folder / "curves_per_alpha.png"
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    paths.append(path)
    return paths


def summary_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """Parent-run metrics: the best value and each (alpha, stack, model) final mean."""
    metric = report["objective"]["metric"]
    values: dict[str, float] = {}
    if report.get("best"):
        values[f"best/{metric}"] = report["best"]["value"]
    for row in report["rows"]:
        key = f"final/{metric}/{row['loss_stack']}/{row['model']}/alpha_{row['alpha']:g}"
        if row.get(f"{metric}_mean") is not None:
            values[key] = row[f"{metric}_mean"]
    return values

"""The report's figures, drawn from report.json (plus per-epoch curves from the outcomes).

- ``{metric}_vs_alpha__{model}__beta_{b}.png``: the report split's metric against alpha, one
  line per stack with its 95% band, one panel per example kind. Undivided stacks share the
  panel's effective beta; a divided stack's effective beta is in its legend entry (the
  matched comparison is the contrasts table).
- ``contrasts.png``: the primary contrasts with their intervals (a forest plot).
- ``interaction.png``: the caveat interaction per alpha with its interval, when present.
- ``curves_per_alpha.png``: the objective metric per epoch for every trial.
- ``rate_distortion.png`` (:data:`RD_PLANE_PNG`): the rate-distortion plane (Alemi et al.
  2018), each cell's rate (test KL, and I(x; z)) against its distortion (test NLL per token,
  unweighted), one line per stack, alpha and model through its betas or target rates.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["RD_PLANE_PNG", "prepare_plotting", "rd_plane_figure", "write_report_plots"]

ALPHA_METRICS = ("latent_nmi", "nmi_auc")
RD_PLANE_PNG = "rate_distortion.png"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def prepare_plotting() -> None:
    """Import pyplot ahead of the first figure (about 0.4 s): a driver does it while Ray starts."""
    _pyplot()


def _alpha_figure(cells: Sequence[Mapping[str, Any]], metric: str, title: str, path: Path) -> Path:
    plt = _pyplot()
    kinds = sorted({c["kind"] for c in cells}, key=lambda k: (k != "all", k))
    figure, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.8), squeeze=False,
                                sharey=True)
    for axis, kind in zip(axes[0], kinds, strict=True):
        lines: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for cell in cells:
            if cell["kind"] == kind and cell["mean"] is not None:
                lines[cell["loss_stack"]].append(cell)
        for stack, members in sorted(lines.items()):
            members.sort(key=lambda c: c["alpha"])
            xs = [c["alpha"] for c in members]
            effective = members[0].get("beta_effective")
            label = stack if effective is None else f"{stack} (eff beta {effective:.3g})"
            (line,) = axis.plot(xs, [c["mean"] for c in members], marker="o", label=label)
            low = [c["ci_low"] if c["ci_low"] is not None else c["mean"] for c in members]
            high = [c["ci_high"] if c["ci_high"] is not None else c["mean"] for c in members]
            axis.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
        axis.set_title(f"kind: {kind}")
        axis.set_xlabel("alpha")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel(metric)
    axes[0][-1].legend(fontsize=7)
    figure.suptitle(title)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def _forest(contrasts: Sequence[Mapping[str, Any]], title: str, path: Path) -> Path:
    plt = _pyplot()
    shown = [c for c in contrasts if c["mean_diff"] is not None]
    figure, axis = plt.subplots(figsize=(8, 0.35 * len(shown) + 1.5))
    for y, c in enumerate(shown):
        low = c["ci_low"] if c["ci_low"] is not None else c["mean_diff"]
        high = c["ci_high"] if c["ci_high"] is not None else c["mean_diff"]
        axis.plot([low, high], [y, y], color="tab:blue")
        axis.plot([c["mean_diff"]], [y], "o", color="tab:blue")
    axis.axvline(0, color="grey", linestyle="--")
    axis.set_yticks(range(len(shown)))
    axis.set_yticklabels([f"{c['loss_stack']}-{c['baseline']} a={c['alpha']:g} {c['kind']} "
                          f"{c['model']} b={c['beta']:g}" if c.get("beta") is not None else
                          f"{c['loss_stack']}-{c['baseline']} a={c['alpha']:g} {c['kind']}"
                          for c in shown], fontsize=7)
    axis.set_xlabel("paired difference, mean and 95% t interval")
    axis.set_title(title)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def _curves(outcomes: Sequence[Any], metric: str, path: Path) -> Path:
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 5))
    by_alpha: dict[float, list[Any]] = defaultdict(list)
    for outcome in outcomes:
        if outcome.history.get(metric):
            by_alpha[float(outcome.params["alpha"])].append(outcome)
    colours = plt.cm.viridis([i / max(1, len(by_alpha) - 1) for i in range(len(by_alpha))])
    for colour, alpha in zip(colours, sorted(by_alpha), strict=False):
        for index, outcome in enumerate(by_alpha[alpha]):
            values = outcome.history[metric]
            axis.plot(range(1, len(values) + 1), values, color=colour, alpha=0.8,
                      label=f"alpha {alpha:g}" if index == 0 else None)
    axis.set_xlabel("epoch")
    axis.set_ylabel(metric)
    axis.set_title(f"{metric} per trial, coloured by alpha")
    if by_alpha:
        axis.legend()
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def rd_plane_figure(rows: Sequence[Mapping[str, Any]], split: str, path: Path) -> Path:
    """The rate-distortion plane of ``rows`` (report.json's ``rd_plane``): two panels, rate as
    KL and as I(x; z) on x, distortion on y; a line per (stack, alpha, model) through its
    cells in order of rate, a colour per stack."""
    plt = _pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    stacks = sorted({r["loss_stack"] for r in rows})
    colours = dict(zip(stacks, plt.cm.tab10(range(len(stacks))), strict=True))
    lines: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["distortion"] is not None:
            lines[(row["loss_stack"], row["alpha"], row["model"])].append(row)
    for axis, rate, name in zip(axes, ("rate_kl", "rate_mutual_info"),
                                ("rate: E[KL] (nats per example)", "rate: I(x; z) (nats)"),
                                strict=True):
        for (stack, alpha, model), members in sorted(lines.items(), key=str):
            shown = sorted((r for r in members if r[rate] is not None), key=lambda r: r[rate])
            if shown:
                axis.plot([r[rate] for r in shown], [r["distortion"] for r in shown], marker="o",
                          color=colours[stack], label=f"{stack} a={alpha:g} {model}")
        axis.set_xlabel(name)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel(f"distortion: {split} NLL per token (unweighted)")
    if lines:
        axes[1].legend(fontsize=7)
    figure.suptitle(f"{split} rate-distortion plane, one point per cell (mean over seeds)")
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def write_report_plots(report: Mapping[str, Any], outcomes: Sequence[Any], folder: Path) -> list[Path]:
    """Every PNG of the report into ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    split, paths = report["split"], []
    groups: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for cell in report["cells"]:
        if cell["split"] == split and cell["metric"] in ALPHA_METRICS:
            groups[(cell["metric"], cell["model"], cell["beta"], cell["free_bits"],
                    cell.get("target_rate"))].append(cell)
    for (metric, model, beta, free_bits, rate), cells in sorted(groups.items(), key=str):
        beta_text = "own" if beta is None else f"{beta:g}"
        name = f"{metric}_vs_alpha__{model}__beta_{beta_text}"
        name += "" if free_bits is None else f"__fb_{free_bits:g}"
        name += "" if rate is None else f"__rate_{rate:g}"
        title = (f"{split} {metric} vs alpha ({model}, beta {beta_text}, free bits "
                 f"{'-' if free_bits is None else f'{free_bits:g}'}"
                 f"{'' if rate is None else f', target rate {rate:g} nats'}); 95% t bands over seeds")
        paths.append(_alpha_figure(cells, metric, title, folder / f"{name}.png"))
    primary = [c for c in report["contrasts"] if c["family"] == "primary"]
    if primary:
        paths.append(_forest(primary, f"primary contrasts on {split}", folder / "contrasts.png"))
    interaction = [c for c in report["contrasts"] if c["contrast"] == "interaction"]
    if interaction:
        paths.append(_forest(interaction, "caveat interaction: (R~ - R_tok) prefix - private",
                             folder / "interaction.png"))
    if report.get("rd_plane"):
        paths.append(rd_plane_figure(report["rd_plane"], split, folder / RD_PLANE_PNG))
    paths.append(_curves(outcomes, report["objective"]["metric"], folder / "curves_per_alpha.png"))
    return paths

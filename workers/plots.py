"""Figures for trial and sweep runs, rendered headless to PNG files.

Each function writes one PNG to ``path`` and returns the path, for ``RunLogger.log_png``. Empty
or degenerate inputs give a figure that says so instead of raising: a plot is a read-out, and a
missing one should never fail a trial. Trials draw five at their end, so drawing is kept cheap
(:func:`_figure` says how; ``benchmarks/bench_plots.py`` measures it).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from cachetools import LRUCache
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from workers.contract import EPOCH_SPLITS, metric_name

__all__ = [
    "plot_kappa_histogram",
    "plot_metric_against_alpha",
    "plot_position_profiles",
    "plot_reconstruction_curves",
]

_RECONSTRUCTION_KEYS = tuple(
    metric_name(split, name)
    for name in ("recon_uniform", "recon_token_weighted", "recon_cc", "recon_ncc")
    for split in EPOCH_SPLITS
)
_LOSS_KEYS = tuple(metric_name(split, name) for name in ("kl", "loss") for split in EPOCH_SPLITS)
_DPI = 110
_PNG_OPTIONS = {"compress_level": 1}  # zlib level: ~3x faster than PIL's 6, files ~1.5x larger
# Fixed margins (figure fractions) that fit these figures' titles, labels and tick labels.
_MARGINS = {"left": 0.1, "right": 0.97, "bottom": 0.13, "top": 0.9, "wspace": 0.22}
_SUPTITLE_TOP = 0.84
# Rendered kappa histograms of this process: (values' sha256, alpha, title) -> PNG bytes;
# 48 = three splits of 16 (data, alpha) pairs, ~30 KB each. cachetools is not thread-safe.
_HISTOGRAMS: LRUCache[tuple[str, float, str], bytes] = LRUCache(maxsize=48)
_HISTOGRAMS_LOCK = threading.Lock()
# An explicit title height: matplotlib otherwise lays out the axes' ticks at every draw to place it.
_TITLE_Y = 1.0


def _figure(width: float, height: float, columns: int = 1) -> tuple[Figure, Any]:
    """A figure on the Agg canvas (headless, no pyplot state) and its ``columns`` axes.

    Trials render five of these at their end, so they are drawn cheaply (measured in
    ``benchmarks/bench_plots.py``): plain :class:`~matplotlib.figure.Figure` objects on the Agg
    canvas (no pyplot figure manager, nothing to close, safe off the main thread), fixed
    margins instead of ``tight_layout`` (which lays every tick label out once more before the
    draw), fixed title heights (else placed by one more tick layout per draw), one filled step
    polygon per histogram instead of a patch per bin, and a fast zlib level for the PNG. A kappa
    histogram is drawn once per process for the same values, alpha and title (the trials of a
    sweep that share data and alpha share them) and its bytes written again.
    """
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure, figure.subplots(1, columns)


def _save(figure: Figure, path: str | os.PathLike[str], suptitle: str | None = None) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if suptitle:
        figure.suptitle(suptitle)
    figure.subplots_adjust(**{**_MARGINS, **({"top": _SUPTITLE_TOP} if suptitle else {})})
    figure.savefig(target, dpi=_DPI, format="png", pil_kwargs=_PNG_OPTIONS)
    return target


def _say_no_data(axes: Axes, message: str = "no data") -> None:
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes)


def plot_kappa_histogram(
    kappa_values: torch.Tensor | np.ndarray | Sequence[float],
    alpha: float,
    path: str | os.PathLike[str],
    title: str | None = None,
) -> Path:
    """Histogram of per-example concentration factors kappa_alpha.

    Vertical lines mark the mean, median (p50) and p90, the statistics logged as
    ``{split}/kappa_mean``, ``_p50`` and ``_p90``.

    Args:
        kappa_values: 1-D per-example kappa_alpha (any shape is flattened). NaN and
            infinite values are left out.
        alpha: The concentration knob, shown in the title.
        path: Where to write the PNG (parent folders are created).
        title: Overrides the default title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`. With no finite value the figure says
        "no data"; a constant array gives a single bar.
    """
    if isinstance(kappa_values, torch.Tensor):
        kappa_values = kappa_values.detach().cpu().to(torch.float64).numpy()
    values = np.asarray(kappa_values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    title = title or f"per-example kappa (alpha = {alpha:g}, n = {values.size})"
    # kappa depends on the data, the base model and alpha only, so the trials of a sweep that
    # differ in their loss stack (or beta, lr...) draw the same histograms: a process (a reused
    # Ray actor) renders each once and writes the same bytes again.
    key = (hashlib.sha256(values.tobytes()).hexdigest(), float(alpha), title)
    with _HISTOGRAMS_LOCK:
        drawn = _HISTOGRAMS.get(key)
    if drawn is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(drawn)
        return target

    figure, axes = _figure(6.4, 4.2)
    axes.set_title(title, y=_TITLE_Y)
    axes.set_xlabel("kappa_alpha")
    axes.set_ylabel("examples")
    if values.size == 0:
        _say_no_data(axes)
    else:
        bins = int(min(50, max(10, math.isqrt(values.size))))
        axes.hist(values, bins=bins, color="tab:blue", alpha=0.75, histtype="stepfilled")
        for statistic, value, style in (
            ("mean", values.mean(), "-"),
            ("p50", np.percentile(values, 50), "--"),
            ("p90", np.percentile(values, 90), ":"),
        ):
            axes.axvline(value, color="black", linestyle=style, label=f"{statistic} = {value:.3g}")
        axes.legend(loc="upper right")
    target = _save(figure, path)
    with _HISTOGRAMS_LOCK:
        _HISTOGRAMS[key] = target.read_bytes()
    return target


def _plot_series(axes: Axes, history: Mapping[str, Sequence[float]], keys: Sequence[str]) -> None:
    drawn = False
    # One colour per term, solid for train and dashed for val, so each pair reads together.
    terms = list(dict.fromkeys(key.split("/", 1)[1] for key in keys))
    for key in keys:
        series = history.get(key)
        if series is None or len(series) == 0:
            continue
        values = np.asarray(series, dtype=np.float64)
        # Val metrics may exist only on some epochs (NaN elsewhere): markers keep
        # isolated points visible where the line breaks.
        axes.plot(
            np.arange(values.size),
            values,
            label=key,
            linestyle="-" if key.startswith("train/") else "--",
            color=f"C{terms.index(key.split('/', 1)[1])}",
            marker="." if values.size <= 50 else None,
        )
        drawn = True
    if drawn:
        axes.legend(fontsize="small")
    else:
        _say_no_data(axes)
    axes.set_xlabel("epoch")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_reconstruction_curves(
    history: Mapping[str, Sequence[float]],
    path: str | os.PathLike[str],
    title: str | None = None,
) -> Path:
    """Training curves: reconstruction terms (left), loss and KL (right), against epoch.

    Args:
        history: Metric name -> one value per epoch (index = epoch). Only the
            ``{train,val}/recon_uniform``, ``/recon_token_weighted``, ``/recon_ncc``,
            ``/kl`` and ``/loss`` keys are drawn; others are ignored. NaN values leave
            gaps.
        path: Where to write the PNG (parent folders are created).
        title: Figure title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`; a panel with none of its keys says "no data".
    """
    figure, (recon_axes, loss_axes) = _figure(11, 4.2, columns=2)
    _plot_series(recon_axes, history, _RECONSTRUCTION_KEYS)
    recon_axes.set_title("reconstruction", y=_TITLE_Y)
    recon_axes.set_ylabel("nats per token")
    _plot_series(loss_axes, history, _LOSS_KEYS)
    loss_axes.set_title("loss and KL", y=_TITLE_Y)
    return _save(figure, path, suptitle=title)


_PROFILE_PANELS = (("l", "l_t (decoder NLL)"), ("b", "b_t (z-free surprisal)"), ("pi", "pi_t (weight)"))


def plot_position_profiles(
    profiles: Mapping[str, Mapping[str, Sequence[float]]],
    path: str | os.PathLike[str],
    title: str | None = None,
) -> Path:
    """Per-position profiles of l_t, b_t and pi_t, one line per example kind.

    Args:
        profiles: kind -> {"l", "b", "pi"} -> mean value at each target position (NaN where
            no example of the kind is active; those positions leave gaps).
        path: Where to write the PNG (parent folders are created).
        title: Figure title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`; with no kinds every panel says "no data".
    """
    figure, axes = _figure(13, 4.0, columns=3)
    for panel, (key, label) in zip(axes, _PROFILE_PANELS, strict=True):
        drawn = False
        for index, (kind, series) in enumerate(sorted(profiles.items())):
            values = np.asarray(series.get(key, []), dtype=np.float64)
            if values.size:
                panel.plot(np.arange(values.size), values, marker=".", label=kind, color=f"C{index}")
                drawn = True
        if drawn:
            panel.legend(fontsize="small")
        else:
            _say_no_data(panel)
        panel.set_title(label, y=_TITLE_Y)
        panel.set_xlabel("target position t")
        panel.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _save(figure, path, suptitle=title)


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def plot_metric_against_alpha(
    rows: Sequence[Mapping[str, Any]],
    metric: str,
    path: str | os.PathLike[str],
    group_key: str = "loss_stack",
) -> Path:
    """A sweep read-out: ``metric`` against alpha, one line per group (loss stack).

    Args:
        rows: Report rows with keys ``alpha``, ``group_key``, ``f"{metric}_mean"`` and
            ``f"{metric}_ci95"`` (half-width of the 95% interval over seeds). Missing or
            NaN means leave a gap; a missing or NaN interval draws no error bar.
        metric: Metric name, e.g. ``"val/recon_uniform"``.
        path: Where to write the PNG (parent folders are created).
        group_key: Row key that defines the lines.

    Returns:
        ``path`` as a :class:`~pathlib.Path`; with no rows the figure says "no data".
    """
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for row in rows:
        groups.setdefault(str(row.get(group_key)), []).append(
            (
                _as_float(row.get("alpha")),
                _as_float(row.get(f"{metric}_mean")),
                _as_float(row.get(f"{metric}_ci95")),
            )
        )

    figure, axes = _figure(6.4, 4.2)
    axes.set_title(f"{metric} against alpha (mean, 95% CI)", y=_TITLE_Y)
    axes.set_xlabel("alpha")
    axes.set_ylabel(metric)
    if not groups:
        _say_no_data(axes)
    for group, points in sorted(groups.items()):
        alphas, means, intervals = (
            np.asarray(column) for column in zip(*sorted(points), strict=True)
        )
        intervals = np.where(np.isfinite(intervals), intervals, 0.0)
        axes.errorbar(alphas, means, yerr=intervals, label=group, marker="o", capsize=3)
    if groups:
        axes.legend(title=group_key, fontsize="small")
    return _save(figure, path)

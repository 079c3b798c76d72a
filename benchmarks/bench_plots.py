"""A trial's five PNGs against the trial itself: what the figures cost per trial.

One quickstart trial (the bench_sweep spec: alpha 1, raw_plus_ncc, 8 epochs) is trained once;
then, interleaved in one process, its five end-of-trial figures (kappa histograms of train,
val and test, the reconstruction curves, the per-position profiles) are rendered to PNG
exactly as :func:`workers.trial.log_trial_plots` renders them, and one epoch is trained.
Printed: the five PNGs' median time (drawn afresh, and with the three kappa histograms
already drawn by the process, as for a later trial of a reused actor that shares its data and
alpha: ``workers/plots.py`` memoises them), one epoch's, and PNGs per trial as a share of the
trial's training time (epochs x epoch). No goal; issue 12 counts it in the per-trial cost.

    python -m benchmarks.bench_plots
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from benchmarks._timing import interleaved_medians
from benchmarks.bench_sweep import bench_spec
from workers import plots
from workers.train import Trainer
from workers.trial import log_trial_plots


class _NoLogger:
    """Stands in for the RunLogger: the PNGs are rendered, not uploaded."""

    def log_png(self, path: Path) -> None:
        assert Path(path).stat().st_size > 0


def plot_cost(repeats: int = 5) -> None:
    spec = bench_spec()
    config = spec.trial_config(1.0, "raw_plus_ncc", "discrete", 0)
    with tempfile.TemporaryDirectory(prefix="bench-plots-") as cache:
        done = Trainer.create(config, cache)
        while not done.finished:
            done.run_epoch()
        done.finalize()
        running = Trainer.create(config.model_copy(update={"training": config.training.model_copy(
            update={"epochs": 10_000, "patience": None})}), cache)
        def five_pngs(memoised: bool):
            def render() -> None:
                if not memoised:
                    plots._HISTOGRAMS.clear()
                log_trial_plots(_NoLogger(), done)
            return render

        medians = interleaved_medians({"five PNGs": five_pngs(False),
                                       "memoised": five_pngs(True),
                                       "one epoch": running.run_epoch}, repeats=repeats, warmup=1)
    epochs = config.training.epochs
    share = medians["five PNGs"] / (medians["one epoch"] * epochs)
    print(f"\n== a trial's PNGs (quickstart, {epochs} epochs; load {os.getloadavg()[0]:.1f})")
    print(f"  five PNGs {medians['five PNGs'] * 1e3:7.0f} ms (histograms memoised: "
          f"{medians['memoised'] * 1e3:.0f} ms)   one epoch "
          f"{medians['one epoch'] * 1e3:7.0f} ms   PNGs / training time {share:.2f}x")


def main() -> None:
    plot_cost()


if __name__ == "__main__":
    main()

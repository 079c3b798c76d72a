"""Following a sweep: the ETA text and the tqdm bar of :meth:`ksweep.Client.wait`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the API's models load with the first answer, not for --help
    from service.api.schemas import Sweep


def format_eta(seconds: float | None) -> str:
    """``3m05s``, ``42s``, or ``-`` when unknown."""
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def finished(sweep: Sweep) -> int:
    """Trials that will not run again: done, stopped early or failed."""
    c = sweep.counters
    return c.done + c.stopped + c.failed


def best_text(sweep: Sweep, short: bool = False) -> str:
    """``val/latent_nmi 0.8123`` (``latent_nmi 0.8123`` when ``short``), or ``-`` before any
    trial reported."""
    best = sweep.best
    if best.value is None:
        return "-"
    metric = (best.metric or "").rsplit("/", 1)[-1] if short else best.metric
    return f"{metric} {best.value:.4f}"


def counter_line(sweep: Sweep) -> str:
    """``3 done, 1 running, 0 pending, 0 stopped, 0 failed of 4``."""
    c = sweep.counters
    return (f"{c.done} done, {c.running} running, {c.pending} pending, "
            f"{c.stopped} stopped, {c.failed} failed of {c.total}")


class WaitBar:
    """A tqdm bar (a widget in notebooks, text in terminals) over finished trials, with the
    sweep's state, best value and the API's ETA (not tqdm's own rate estimate)."""

    def __init__(self, sweep_id: str) -> None:
        import importlib.util

        # tqdm.auto wants ipywidgets for its notebook widget and warns without it: text then.
        if importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.auto import tqdm
        else:
            from tqdm import tqdm

        self.bar: Any = tqdm(total=None, desc=sweep_id, unit="trial", dynamic_ncols=True,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                        "[{elapsed}{postfix}]")

    def update(self, sweep: Sweep) -> None:
        self.bar.set_description_str(f"{sweep.name} ({sweep.id})", refresh=False)
        if sweep.counters.total and self.bar.total != sweep.counters.total:
            self.bar.total = sweep.counters.total
        self.bar.n = finished(sweep)
        self.bar.set_postfix_str(f"{sweep.state}, best {best_text(sweep)}, "
                                 f"ETA {format_eta(sweep.eta_seconds)}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()

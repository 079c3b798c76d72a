"""``ksweep report``'s rate tables in the terminal: the achieved rate against the target (with
its flag) and the rate-distortion plane, fitted to the width like the other tables
(:mod:`ksweep.cli.fitted_table`); the words come from :mod:`sweeps.report.rate_text`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.table import Table

from ksweep.cli.fitted_table import Column, fit_table
from sweeps.report.rate_text import (
    RATE_COLUMNS,
    RD_COLUMNS,
    rate_rows,
    rate_title,
    rd_note,
    rd_rows,
    rd_title,
)

__all__ = ["rate_tables"]

# At a narrow width: the stack, alpha, the target, the achieved KL and the flag stay.
_RATE_KEEP = {"loss_stack", "alpha", "target rate", "achieved KL [95%]", "rate"}
_RD_KEEP = {"loss_stack", "alpha", "rate KL", "rate I(x; z)", "distortion"}
# Among the columns that may leave, the lowest rank leaves first: the multiplier, then I(x; z).
_RANK = {"model": 3, "beta": 3, "KL / target": 2, "I(x; z) [95%]": 1, "n": 1}


def _columns(names: Sequence[str], rows: list[list[str]], keep: set[str],
             label: Callable[[str], str]) -> list[Column]:
    columns = [Column(name.replace("_", " "), keep=name in keep,
                      whole=name not in ("loss_stack", "beta"), rank=_RANK.get(name, 0),
                      justify="right" if name == "alpha" else "left") for name in names]
    stack = list(names).index("loss_stack")
    for row in rows:
        for index, (column, text) in enumerate(zip(columns, row, strict=True)):
            column.cells.append(label(text) if index == stack else text)
    return columns


def rate_tables(report: Mapping[str, Any], width: int, label: Callable[[str], str]
                ) -> list[tuple[Table, list[str], list[str]]]:
    """Each rate table, the words saying what left it, and the words printed under it."""
    tables: list[tuple[Table, list[str], list[str]]] = []
    rates = rate_rows(report)
    if rates:
        tables.append((*fit_table(rate_title(report), _columns(RATE_COLUMNS, rates, _RATE_KEEP, label),
                                  width), []))
    plane = rd_rows(report)
    if plane:
        tables.append((*fit_table(rd_title(report), _columns(RD_COLUMNS, plane, _RD_KEEP, label),
                                  width), [rd_note(report)]))
    return tables

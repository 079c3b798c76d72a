"""Tables that fit the terminal without cutting a word.

A column is never narrower than its longest word (a column marked ``whole`` never narrower
than its longest cell: an interval stays on one line), so rich wraps between words only.
When the table is still wider than the terminal, columns leave it whole, never cut: a column
holding one value in every row goes to the title (``model discrete``), then the columns that
may go are dropped (lowest rank first, then from the right) and named under the table. Stack labels are shortened by
:func:`short_labels` (the caller prints the legend).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

__all__ = ["Column", "fit_table", "short_labels"]


@dataclass
class Column:
    """One column: its header, its cells (text), and how it may fit."""

    header: str
    cells: list[str] = field(default_factory=list)
    keep: bool = False  # never leaves the table
    whole: bool = False  # each cell on one line (intervals, labels)
    justify: str = "left"
    rank: int = 0  # among the columns that may leave, the lowest rank leaves first (then the rightmost)

    def min_width(self) -> int:
        """The longest word (header included); with ``whole``, the longest cell."""
        words = [*self.header.split(), *(self.cells if self.whole else
                                         (w for text in self.cells for w in text.split()))]
        return max((len(word) for word in words), default=1)


def _table(title: str, columns: Sequence[Column]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, padding=(0, 1))
    for column in columns:
        table.add_column(column.header, min_width=column.min_width(), no_wrap=column.whole,
                         overflow="fold", justify=column.justify)  # type: ignore[arg-type]
    for row in zip(*(column.cells for column in columns), strict=True):
        table.add_row(*row)
    return table


def _fits(console: Console, table: Table, width: int) -> bool:
    # Measured without a limit: Measurement.get clamps what it returns to the width it is given.
    measured = Measurement.get(console, console.options.update_width(10_000), table)
    return measured.minimum <= width


def fit_table(console: Console, title: str, columns: Sequence[Column], width: int
              ) -> tuple[Table, list[str]]:
    """The table within ``width``, and the words saying what left it (empty when nothing)."""
    columns = list(columns)
    notes: list[str] = []
    if _fits(console, _table(title, columns), width):
        return _table(title, columns), notes
    constant = [c for c in columns if not c.keep and len(c.cells) > 1 and len(set(c.cells)) == 1]
    if constant:
        title = f"{title} ({', '.join(f'{c.header} {c.cells[0]}' for c in constant)})"
        columns = [c for c in columns if c not in constant]
    dropped = []
    while not _fits(console, _table(title, columns), width):
        movable = [c for c in columns if not c.keep]
        if not movable:
            break
        leaving = min(reversed(movable), key=lambda c: c.rank)
        dropped.append(leaving.header)
        columns.remove(leaving)
    if dropped:
        notes.append(f"not shown at {width} columns: {', '.join(dropped)} (a wider terminal or "
                     "--format md shows them)")
    return _table(title, columns), notes


def short_labels(labels: Iterable[str], longest: int = 7) -> dict[str, str]:
    """A short label per stack label: kept when at most ``longest`` characters, else the
    initials of its parts (``raw_token_weighted`` -> ``rtw``), numbered when two collide."""
    short: dict[str, str] = {}
    for label in dict.fromkeys(labels):
        if len(label) <= longest:
            candidate = label
        else:
            parts = [p for p in re.split(r"[_.\-]+", label) if p]
            candidate = "".join(p[0] for p in parts) if len(parts) > 1 else label[:longest]
        base, number = candidate, 2
        while candidate in short.values():
            candidate, number = f"{base}{number}", number + 1
        short[label] = candidate
    return short

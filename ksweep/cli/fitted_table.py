"""Tables that fit the terminal without cutting a word.

A column is never narrower than what puts each of its cells on two lines at words (a column
marked ``whole`` never narrower than its longest cell: an interval stays on one line), so a
row is at most two lines and rich wraps between words only.
When the table is still wider than the terminal, columns leave it whole, never cut: a column
holding one value in every row goes to the title (``model discrete``), then the columns that
may go are dropped (lowest rank first, then from the right) and named under the table; when
even the columns that stay do not fit side by side, each row is shown as lines of ``header
value``. Stack labels are shortened by
:func:`short_labels` (the caller prints the legend).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from rich import box
from rich.table import Table
from rich.text import Text

__all__ = ["MAX_LINES", "Column", "fit_layouts", "fit_table", "short_labels", "wrap_width"]


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
        """The least width that puts the header and every cell on at most :data:`MAX_LINES`
        lines without cutting a word; with ``whole``, every cell on one line."""
        cells = [len(text) for text in self.cells] if self.whole else [
            wrap_width(text, MAX_LINES) for text in self.cells]
        return max([wrap_width(self.header, MAX_LINES), *cells])


MAX_LINES = 2  # a row of a table is at most two lines: a reader scans it row by row


def _line_count(words: Sequence[str], width: int) -> int:
    """Lines of a greedy word wrap (as rich wraps) of ``words`` at ``width``."""
    lines, used = 1, -1
    for word in words:
        if used + 1 + len(word) > width and used >= 0:
            lines, used = lines + 1, len(word)
        else:
            used += 1 + len(word)
    return lines


def wrap_width(text: str, lines: int) -> int:
    """The least width at which ``text`` wraps at words into at most ``lines`` lines."""
    words = text.split()
    if not words:
        return 1
    low, high = max(len(word) for word in words), len(" ".join(words))
    while low < high:  # the line count only falls as the width grows
        middle = (low + high) // 2
        if _line_count(words, middle) <= lines:
            high = middle
        else:
            low = middle + 1
    return low


GAP = 3  # between two columns: a padding, the (blank) rule, a padding


def _widths(columns: Sequence[Column], width: int) -> list[int]:
    """Each column's width within ``width``: its natural width when all fit, else its minimum
    plus a share of what is left (the columns that need least are made whole first). Rich's
    own shrinking would narrow a column below its longest word."""
    natural = [max(column.min_width(), *(len(cell) for cell in column.cells), len(column.header))
               for column in columns]
    widths = [column.min_width() for column in columns]
    spare = width - GAP * (len(columns) - 1) - sum(widths)
    for index in sorted(range(len(columns)), key=lambda i: natural[i] - widths[i]):
        grant = min(spare, natural[index] - widths[index])
        widths[index] += grant
        spare -= grant
    return widths


def _table(title: str, columns: Sequence[Column], width: int) -> Table:
    table = Table(title=Text(title), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, padding=(0, 1))
    for column, fixed in zip(columns, _widths(columns, width), strict=True):
        table.add_column(Text(column.header), width=fixed, no_wrap=column.whole, overflow="fold",
                         justify=column.justify)  # type: ignore[arg-type]
    for row in zip(*(column.cells for column in columns), strict=True):
        table.add_row(*(Text(cell) for cell in row))  # plain text, never markup
    return table


def _fits(columns: Sequence[Column], width: int) -> bool:
    return sum(column.min_width() for column in columns) + GAP * (len(columns) - 1) <= width


def fit_table(title: str, columns: Sequence[Column], width: int) -> tuple[Table, list[str]]:
    """The table within ``width``, and the words saying what left it (empty when nothing)."""
    table, notes, _ = _fit(title, columns, width)
    return table, notes


def fit_layouts(title: str, layouts: Sequence[tuple[Sequence[Column], Sequence[str]]],
                width: int) -> tuple[Table, list[str], list[str]]:
    """The first layout that fits ``width`` whole (no column leaves), else the last one fitted.

    A layout is the table's columns and the legend printed under it: the first in words and
    no legend, the next with short codes and the legend line that reads them. Returns the
    table, the words saying what left it, and the chosen layout's legend."""
    for index, (columns, legend) in enumerate(layouts):
        table, notes, whole = _fit(title, columns, width)
        if whole or index == len(layouts) - 1:
            return table, notes, list(legend)
    raise ValueError("fit_layouts needs at least one layout")


def _fit(title: str, columns: Sequence[Column], width: int) -> tuple[Table, list[str], bool]:
    """:func:`fit_table`, and whether every column stayed side by side."""
    columns = list(columns)
    notes: list[str] = []
    natural = [replace(c, whole=True) for c in columns]  # every cell on one line
    if _fits(natural, width):
        return _table(title, columns, width), notes, True
    constant = [c for c in columns if not c.keep and len(c.cells) > 1 and len(set(c.cells)) == 1]
    if constant:
        title = f"{title} ({', '.join(f'{c.header} {c.cells[0]}' for c in constant)})"
        columns = [c for c in columns if c not in constant]
    dropped = []
    while not _fits(columns, width):
        movable = [c for c in columns if not c.keep]
        if not movable:  # even the kept columns do not fit side by side
            return _records(title, columns), notes, False
        leaving = min(reversed(movable), key=lambda c: c.rank)
        dropped.append(leaving.header)
        columns.remove(leaving)
    if dropped:
        notes.append(f"not shown at {width} columns: {', '.join(dropped)} (a wider terminal or "
                     "--format md shows them)")
    return _table(title, columns, width), notes, not dropped


def _records(title: str, columns: Sequence[Column]) -> Table:
    """The rows one below the other, each column a line ``header  value`` (folded whole)."""
    grid = Table(title=Text(title), title_justify="left", box=None, show_header=False,
                 pad_edge=False, padding=(0, 1))
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column(overflow="fold")
    for index, row in enumerate(zip(*(column.cells for column in columns), strict=True)):
        if index:
            grid.add_row("", "")
        for column, text in zip(columns, row, strict=True):
            grid.add_row(Text(column.header, style="bold"), Text(text))
    return grid


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

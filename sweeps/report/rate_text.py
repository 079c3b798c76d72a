"""The rate sections of report.md and ``ksweep report``'s terminal view, from report.json: the
achieved rate against the target (flagged when off), the rate-distortion plane as a table, and
the words on unpriced information beside the latent-use numbers. Nothing here computes a
statistic (:mod:`sweeps.report.rates` does)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["RATE_COLUMNS", "RD_COLUMNS", "credit_notes", "rate_markdown", "rate_rows", "rate_title",
           "rd_note", "rd_rows", "rd_title", "unpriced_words"]

RATE_COLUMNS = ("model", "beta", "loss_stack", "alpha", "target rate", "achieved KL [95%]",
                "KL / target", "I(x; z) [95%]", "multiplier", "rate")
RD_COLUMNS = ("model", "beta", "loss_stack", "alpha", "rate KL", "rate I(x; z)", "distortion", "n")


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(entry: Mapping[str, Any] | None) -> str:
    if not entry or entry.get("mean") is None:
        return "-"
    if entry.get("ci_low") is None:
        return f"{entry['mean']:.3f} (n={entry.get('n', 1)})"
    return f"{entry['mean']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def _beta(entry: Mapping[str, Any]) -> str:
    return "-" if entry.get("beta") is None else f"{entry['beta']:g}"


def _flag(row: Mapping[str, Any]) -> str:
    if row["off_target"] is None:
        return "no rate logged"
    seeds = f"{row['seeds_off_target']}/{row['seeds']} seeds off"
    return f"OFF TARGET ({seeds})" if row["off_target"] else f"on target ({seeds})"


def _order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row["model"], row.get("beta") if row.get("beta") is not None else -1,
            row.get("free_bits") or 0, row.get("target_rate") or 0, row["loss_stack"], row["alpha"])


def rate_title(report: Mapping[str, Any]) -> str:
    """The achieved-rate table's title."""
    tolerance = next((row["tolerance"] for row in report.get("rates") or []), None)
    flag = "" if tolerance is None else f"; OFF TARGET: more than {tolerance:.0%} off the target"
    return (f"Achieved rate against target ({report['split']} E[KL], nats per example, at the "
            f"checkpoint val chose{flag})")


def rate_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """The achieved-rate table's rows as text (columns :data:`RATE_COLUMNS`)."""
    return [[row["model"], _beta(row), row["loss_stack"], f"{row['alpha']:g}",
             f"{row['target_rate']:g}", _interval(row["achieved_kl"]), _num(row["ratio"], 2),
             _interval(row["achieved_mutual_info"]), _num(row.get("kl_multiplier")), _flag(row)]
            for row in sorted(report.get("rates") or [], key=_order)]


def rd_title(report: Mapping[str, Any]) -> str:
    """The rate-distortion table's title."""
    return f"Rate-distortion plane ({report['split']}; mean over seeds)"


def rd_note(report: Mapping[str, Any]) -> str:
    """What the rate-distortion table's columns are."""
    return ("Rate: E[KL] (nats per example) and I(x; z) (nats); distortion: the unweighted NLL per "
            "target token (recon_uniform), one unit for every stack. Compare stacks along this "
            "plane (Alemi et al. 2018) or at one target rate, not at one beta: a weighted "
            "reconstruction changes the distortion's scale, so one beta is not one rate.")


def rd_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """The rate-distortion table's rows as text (columns :data:`RD_COLUMNS`), by stack then rate."""
    rows = []
    for row in report.get("rd_plane") or []:
        beta = _beta(row) + ("" if row.get("target_rate") is None
                             else f" (target rate {row['target_rate']:g})")
        rows.append([row["model"], beta, row["loss_stack"], f"{row['alpha']:g}",
                     _num(row["rate_kl"]), _num(row["rate_mutual_info"]), _num(row["distortion"]),
                     str((row.get("recon_uniform") or {}).get("n", "-"))])
    return rows


def unpriced_words(row: Mapping[str, Any]) -> str:
    """The latent-use verdict's addition for a row trained with the credit ('' otherwise)."""
    if row.get("information_priced") is not False:
        return ""
    return f"; information free (unpriced, credit {row['mutual_info_credit']:g})"


def credit_notes(report: Mapping[str, Any]) -> list[str]:
    """The words printed under the latent-use table where any cell trained with the credit."""
    return [words for words in report.get("limitations", []) if words.startswith("UNPRICED")]


def _table(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    lines = [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def rate_markdown(report: Mapping[str, Any]) -> list[str]:
    """report.md's rate sections (none for a report without rate tables)."""
    lines: list[str] = []
    rates = rate_rows(report)
    if rates:
        lines += _table(rate_title(report), RATE_COLUMNS, rates)
    plane = rd_rows(report)
    if plane:
        lines += _table(rd_title(report), RD_COLUMNS, plane) + [rd_note(report), ""]
    return lines

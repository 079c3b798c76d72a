"""The terminal report at 80 columns: every line fits, and no word is cut (single, grown and
compared reports, built from trial results known by construction)."""

import io

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ksweep.cli.fitted_table import Column, fit_table, short_labels
from ksweep.cli.report_view import report_renderables
from sweeps.plan.growth import ExtensionRequest, extend_spec
from sweeps.report.build import build_report
from sweeps.report.compare import compare_report
from tests.sweeps.test_growth import EXTENSION
from tests.sweeps.test_report import caveat_spec, known_outcomes

BOX = set("─━│┃┏┓┗┛┣┫┳┻╋┡┩╇└┘┌┐├┤┬┴┼╸╺ ")


def _words(renderable) -> set[str]:
    """Every word the renderable was given (titles, headers, cells, paragraphs)."""
    if isinstance(renderable, Text):
        return set(renderable.plain.split())
    if isinstance(renderable, str):
        return set(renderable.split())
    assert isinstance(renderable, Table), type(renderable)
    words = _words(renderable.title or "")
    for column in renderable.columns:
        words |= _words(column.header)
        for cell in column._cells:
            words |= _words(cell)
    return words


def _rendered(report, width: int = 80) -> tuple[list[str], set[str]]:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    renderables = report_renderables(report, width)
    given = set().union(*(_words(r) for r in renderables))
    for renderable in renderables:
        console.print(renderable)
    return console.export_text().splitlines(), given


def _assert_readable(report) -> list[str]:
    lines, given = _rendered(report)
    assert max(len(line) for line in lines) <= 80
    shown = {word for line in lines for word in line.split() if not set(word) <= BOX}
    cut = shown - given
    assert not cut, f"words cut or changed at 80 columns: {sorted(cut)[:10]}"
    return lines


def _quickstart_like():
    """Three stacks, among them concentration_corrected (the issue's "concentratio /
    n_corrected"), three alphas, five seeds, two kinds beside all."""
    spec = caveat_spec(alpha=[0, 1, 2], seeds=[0, 1, 2, 3, 4])
    return spec, build_report(spec, "d2fba9417407", known_outcomes(spec))


def test_a_report_at_80_columns_cuts_no_word_and_keeps_its_numbers():
    spec, report = _quickstart_like()
    lines = _assert_readable(report)
    text = "\n".join(lines)
    assert "concentration_corrected" in text  # in the legend, whole
    assert "cc = concentration_corrected" in text and "rtw = raw_token_weighted" in text
    # Intervals stay on one line; the ties on val are listed, not wrapped in a column.
    interval = next(c for c in report["cells"] if c["split"] == "test" and c["kind"] == "all"
                    and c["metric"] == "latent_nmi" and c["loss_stack"] == "uniform")
    assert f"{interval['mean']:.3f} [{interval['ci_low']:.3f}, {interval['ci_high']:.3f}]" in text
    assert "tied on val with" in text
    assert any(line.startswith("  not shown at 80 columns:") for line in lines)
    wide, _ = _rendered(report, width=200)
    assert "raw_token_weighted" in "\n".join(line for line in wide if "rtw" not in line)
    assert not any("not shown" in line for line in wide)


def test_grown_and_compared_reports_at_80_columns():
    spec = caveat_spec()
    grown = extend_spec(spec, ExtensionRequest(seeds=[3], alpha=[0.5]))
    report = build_report(grown, "s1", known_outcomes(grown), extensions=[EXTENSION])
    lines = _assert_readable(report)
    assert any("extension 1: added seeds 3; alpha 0.5, after report 1" in " ".join(lines[i:i + 2])
               for i in range(len(lines)))
    assert "fixed-n" in "\n".join(lines)
    first, second = caveat_spec(loss_stacks=["uniform", "raw_token_weighted"]), caveat_spec(
        loss_stacks=["uniform", {"name": "concentration_corrected",
                                 "terms": {"concentration_corrected": 1.0}}], seeds=[1, 2, 3])
    outcomes = {"a": known_outcomes(first), "b": known_outcomes(second)}
    for sweep, items in outcomes.items():
        for outcome in items:
            outcome.trial_id = f"{sweep}-{outcome.trial_id}"
    compared = compare_report({"a": first, "b": second}, outcomes, {"a": "one", "b": "two"})
    lines = _assert_readable(compared)
    assert "- a (one): 6 trials, seeds 0, 1, 2" in lines and "- b (two): 6 trials, seeds 1, 2, 3" in lines


def test_columns_leave_whole_and_labels_shorten():
    assert short_labels(["uniform", "raw_token_weighted", "concentration_corrected",
                         "normalized_concentration_corrected", "raw_plus_ncc", "rtw"]) == {
        "uniform": "uniform", "raw_token_weighted": "rtw", "concentration_corrected": "cc",
        "normalized_concentration_corrected": "ncc", "raw_plus_ncc": "rpn", "rtw": "rtw2"}
    columns = [Column("name", ["alpha beta", "gamma"], keep=True),
               Column("same", ["x", "x"]),
               Column("wide", ["0.123 [0.100, 0.200]", "0.5 [0.4, 0.6]"], whole=True),
               Column("drop me first", ["a", "b"], rank=-1), Column("last", ["words words", "w"])]
    table, notes = fit_table("t", columns, 30)
    assert str(table.title) == "t (same x)" and [str(c.header) for c in table.columns] == [
        "name", "wide"]
    assert notes == ["not shown at 30 columns: drop me first, last (a wider terminal or "
                     "--format md shows them)"]
    table, notes = fit_table("t", columns, 200)
    assert len(table.columns) == 5 and notes == []


@pytest.mark.parametrize("width", [60, 100])
def test_other_widths_fit_too(width):
    _, report = _quickstart_like()
    lines, given = _rendered(report, width)
    assert max(len(line) for line in lines) <= width
    assert {w for line in lines for w in line.split() if not set(w) <= BOX} <= given

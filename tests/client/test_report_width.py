"""The terminal report at 80 columns: every line fits, and no word is cut (single, grown and
compared reports, built from trial results known by construction)."""

import copy
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ksweep.cli.fitted_table import Column, fit_table, short_labels, wrap_width
from ksweep.cli.report_view import report_renderables
from sweeps import SweepSpec
from sweeps.plan.growth import ExtensionRequest, extend_spec
from sweeps.report.build import build_report, report_markdown
from sweeps.report.compare import compare_report
from sweeps.report.contrasts import claim_words
from sweeps.report.verdicts import claim_code
from tests.sweeps.test_growth import EXTENSION
from tests.sweeps.test_report import CC, SEEDS, caveat_spec, known_outcomes, latent_outcomes

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


ADJADV = Path(__file__).parents[2] / "docs/science/real_text_wordnet/adjadv/report.json"


def _row_heights(table: Table, width: int) -> tuple[int, list[int]]:
    """The header's lines and each row's lines as ``table`` renders at ``width`` (rows drawn
    apart by the blank separator lines that ``show_lines`` adds to this box)."""
    apart = copy.copy(table)
    apart.show_lines, apart.title = True, None
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(apart)
    lines = console.export_text().splitlines()
    header = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    heights, height = [], 0
    for line in lines[header + 1:]:
        if line.strip():
            height += 1
        elif height:
            heights, height = [*heights, height], 0
    return header, heights + ([height] if height else [])


def _latent_report():
    """uniform collapsed (0 of 3 seeds), R_tok in use with its AMI at chance, R~ in use."""
    spec = SweepSpec.model_validate({
        "name": "latent", "template": {"data": {"num_strategies": 2}}, "alpha": [1],
        "loss_stacks": ["uniform", "raw_token_weighted", CC], "seeds": list(SEEDS)})
    values = {"uniform": ([0.01, 0.02, 0.03], [0.001, 0.0, 0.002], [0.0, 0.01, -0.01]),
              "raw_token_weighted": ([0.31, 0.32, 0.33], [0.5, 0.6, 0.7], [0.02, -0.01, 0.0]),
              "concentration_corrected": ([0.41, 0.42, 0.44], [0.5, 0.02, 0.7], [0.3, 0.32, 0.31])}
    return build_report(spec, "l", latent_outcomes(spec, values))


REPORTS = {"quickstart": lambda: _quickstart_like()[1], "latent": _latent_report,
           "dataset": lambda: json.loads(ADJADV.read_text())}


@pytest.mark.parametrize("width", [60, 80, 100])
@pytest.mark.parametrize("name", sorted(REPORTS))
def test_every_table_row_fits_two_lines(name, width):
    """Quickstart's report, a latent-use report with every verdict, and the WordNet adj/adv
    dataset report: at 60, 80 and 100 columns every table keeps a header and rows of at most
    two lines; the verdicts are codes with their legend line where the words do not fit."""
    report = REPORTS[name]()
    renderables = report_renderables(report, width)
    tables = [r for r in renderables if isinstance(r, Table) and r.show_header and r.box]
    assert len(tables) >= 3
    for table in tables:
        header, heights = _row_heights(table, width)
        assert heights and max(heights) <= 2, (str(table.title), heights)
        assert header <= 2, str(table.title)
    lines, _ = _rendered(report, width)
    assert max(len(line) for line in lines) <= width
    assert not any(isinstance(r, Table) and r.title and not r.show_header
                   for r in renderables), "a table fell back to one record per row"
    text = " ".join(" ".join(lines).split())
    headers = {str(column.header) for table in tables for column in table.columns}
    codes = {str(cell) for table in tables for column in table.columns
             if str(column.header) == "latent" for cell in column._cells}
    if codes & {"used", "chance", "off"} or any(re.fullmatch(r"(used|chance|off) \d+/\d+", c)
                                                 for c in codes):
        assert "latent: used k/n = mean I(x; z) >= 0.05 nats" in text
    if "verdict" in headers:
        assert "verdict: higher/lower = Holm p < 0.05" in text
    if name == "dataset" and width <= 80:  # the words do not fit there: codes and legends
        assert "verdict" in headers and "used 5/5" in codes
    assert "per seed" in text  # its column (each value list on one line), or named as left out


def test_latent_verdict_codes_and_the_per_seed_values_in_markdown():
    report = _latent_report()
    lines, _ = _rendered(report, 80)
    verdicts = {line.split()[0]: " ".join(line.split()[-2:]) for line in lines
                if line.split() and line.split()[0] in ("uniform", "rtw", "cc")
                and line.split()[1] == "1" and "/" in line}
    assert verdicts == {"uniform": "off 0/3", "rtw": "chance 3/3", "cc": "used 2/3"}
    markdown = report_markdown(report)
    assert "collapsed (0 of 3 seeds in use); AMI at chance" in markdown
    assert "in use (2 of 3 seeds in use)" in markdown
    uniform = next(line for line in markdown.splitlines() if line.startswith("| discrete | 1")
                   and "| uniform | 1 |" in line and "seeds in use" not in line)
    assert "0.01, 0.02, 0.03" in uniform  # the per-seed values the terminal leaves to md
    wide, _ = _rendered(report, 600)
    assert "in use (3 of 3 seeds in use); AMI at chance" in "\n".join(wide)
    assert not any(line.strip().startswith("latent: used k/n") for line in wide)


def test_wrap_width_is_the_least_width_for_the_lines():
    assert wrap_width("0.45, 0.46, 0.47, 0.48, 0.49", 1) == 28
    assert wrap_width("0.45, 0.46, 0.47, 0.48, 0.49", 2) == 16  # "0.45, 0.46," / "0.47, 0.48, 0.49"
    assert wrap_width("in use (2 of 3 seeds in use)", 2) == 14
    assert wrap_width("", 2) == 1 and wrap_width("word", 2) == 4
    column = Column("used categories", ["a b c d e f"])
    assert column.min_width() == 10  # "used / categories": the header's two lines decide


def test_claim_codes_read_the_fields_the_words_are_built_from():
    base = {"family": "primary", "n_pairs": 5, "mean_diff": 0.1, "ci_low": 0.05, "ci_high": 0.15,
            "p_adjusted": 0.01, "loss_stack": "rtw", "baseline": "uniform", "latent_in_use_nats": 0.05}
    cases = [({}, "higher"), ({"mean_diff": -0.1, "ci_low": -0.15, "ci_high": -0.05}, "lower"),
             ({"p_adjusted": 0.2}, "n.s.*"), ({"p_adjusted": 0.2, "ci_low": -0.01}, "n.s."),
             ({"baseline_constant": True}, "higher!"), ({"family": "exploratory"}, "explor."),
             ({"n_pairs": 2}, "no claim"), ({"identical_objective": True}, "identical"),
             ({"latent_gated": True, "treated_latent": "collapsed", "baseline_latent": "collapsed"},
              "both off"),
             ({"latent_gated": True, "treated_latent": "at chance", "baseline_latent": "at chance"},
              "both chance"),
             ({"latent_gated": True, "treated_latent": "collapsed", "baseline_latent": "at chance"},
              "unused")]
    for change, code in cases:
        entry = {**base, **change}
        words = claim_words(entry)
        assert claim_code(entry) == code, (change, words)
        first = {"higher": "higher", "lower": "lower", "n.s.*": "no significant",
                 "n.s.": "no significant", "higher!": "higher", "explor.": "exploratory",
                 "no claim": "no claim", "identical": "identical", "both off": "both collapsed",
                 "both chance": "both at chance", "unused": "neither side"}[code]
        assert words.startswith(first), (code, words)

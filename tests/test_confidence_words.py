"""One rule for every probability the tool prints (issue 41: one confidence was printed 99.95 %,
"> 99.9 %" and "100.0 %"; `bisect replay` of a locate's journal said "first bad release: v0.26.0
(100.0 %)" where its report said "the compiled side (99.5 %)"; q's median 0.0045 was printed
0.01)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gitrepos import run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.demo.summary import DemoOutcome, format_summary
from bisect_tool.designs import ledger
from bisect_tool.report import render_report
from bisect_tool.values import percent, rate_text

DOCS = Path(__file__).resolve().parent.parent / "docs"
JOURNALS = sorted(p for p in DOCS.rglob("*.jsonl"))


@pytest.mark.parametrize(("x", "shown"), [
    (0.9997, "99.97%"), (0.9995, "99.95%"), (0.99996, "99.996%"), (0.996, "99.6%"),
    (0.99949, "99.9%"), (0.5, "50.0%"), (0.0004, "0.04%"), (0.103, "10.3%"),
    (1.0, "100%"), (0.0, "0%"), (None, "-"), (1 - 1e-9, "> 99.9999%"), (1e-9, "< 0.0001%"),
])
def test_a_probability_is_never_rounded_to_a_certainty(x: float | None, shown: str) -> None:
    assert percent(x) == shown


@pytest.mark.parametrize(("x", "shown"), [
    (0.61, "0.61"), (0.0045, "0.0045"), (0.034, "0.034"), (0.09, "0.090"), (0.999, "0.999"),
    (1.0, "1.00"), (0.0, "0.00"), (None, "-"),
])
def test_a_rate_keeps_two_significant_digits_below_a_tenth(x: float | None, shown: str) -> None:
    assert rate_text(x) == shown


def _bold_figure(report: str) -> str:
    """The confidence the report's first lines state, in bold (a bisect's or a locate's)."""
    found = re.search(r"\*\*([<>]? ?[\d.]+%)\*\*", report)
    assert found, report[:400]
    return found.group(1)


@pytest.mark.parametrize("journal", JOURNALS, ids=lambda p: str(p.relative_to(DOCS)))
def test_replay_and_status_print_the_figure_the_report_prints(
    journal: Path, tmp_path: Path
) -> None:
    report = render_report(journal)
    if "**" not in report.split("\n\n", 2)[1] or "% " not in report + " ":
        pytest.skip("no confidence stated: a run that stopped without an answer")
    contents = journal_mod.read(journal)
    code, out, _ = run_cli("replay", str(journal))
    if contents.header.get("mode") == "locate":
        title = report.splitlines()[0]
        found = re.search(r"([\d.]+%)\)$", title)
        assert found, title
        figure = found.group(1)
        # the locate's report and its replay name the same explanation at the same figure
        first = out.splitlines()[0]
        assert f"({figure})" in first or f"({figure}), below" in first, (first, figure)
        assert code == (0 if "not decided" not in title else 9)
        words = re.search(r"## Locate: (?:not decided \()?([a-z ]+?)[ (:]", report)
        assert words and words.group(1) in first, (first, report.splitlines()[0])
        return
    if contents.end is None or contents.end.get("state") != "done":
        return  # stopped without an answer, or cut by a deadline (a journal without its end)
    figure = _bold_figure(report)
    assert code == 0
    assert f"(confidence {figure}, " in out.splitlines()[0], (out, figure)
    state = tmp_path / "state"
    state.mkdir()
    (state / journal_mod.JOURNAL_NAME).write_bytes(journal.read_bytes())
    code, status, err = run_cli("status", "--state-dir", str(state))
    assert code == 0, err
    assert f" at {figure}\n" in status, (status, figure)
    assert percent(ledger.replay(contents).standing().status()["confidence"]) == figure


def test_the_demo_summary_and_the_report_print_one_confidence_alike() -> None:
    text = format_summary(DemoOutcome(
        found_commit="a" * 40, planted_commit="a" * 40, confidence=0.99969,
        p_estimate=0.61, p_interval=(0.34, 0.83), lifetimes=24, wall_s=40.0,
        report_path="report.md", plot_path=None))
    assert "99.97%" in text and "99.9%" not in text and "100" not in text
    assert "0.61 (90% credible interval 0.34 to 0.83)" in text


def test_q_median_below_a_hundredth_is_printed_as_it_is() -> None:
    journal = DOCS / "bench" / "gpu-2026-12-07-h100" / "journal-nonarrow.jsonl"
    contents = journal_mod.read(journal)
    q = ledger.replay(contents).standing().q_median
    assert 0 < q < 0.01
    report = render_report(journal)
    row = next(line for line in report.splitlines() if line.startswith("| q: "))
    assert f"| {rate_text(q)} \\[" in row, row
    assert "| 0.01 \\[" not in row

"""`bisect report` (tests/test_report.py) for the posterior plot, drawn or as text, and the op
probe's table of lifetimes, on the same real journal."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_report import (
    FLIP,
    STATE,
    SUBJECTS,
    UNTESTABLE,
    evidence_rows,
    parse,
    sha,
    write_journal,
)

from bisect_tool import journal
from bisect_tool.errors import StateError
from bisect_tool.journal import Journal, JournalContents
from bisect_tool.probes.op import op_verdict, summarize_cases
from bisect_tool.report import build_report, plot_posterior, render_markdown, text_plot


@pytest.fixture(scope="module")
def contents(tmp_path_factory: pytest.TempPathFactory) -> JournalContents:
    path = tmp_path_factory.mktemp("session") / journal.JOURNAL_NAME
    write_journal(path)
    return journal.read(path)


def test_no_posterior_plot_below_eight_candidates(contents: JournalContents) -> None:
    small = {**contents.header, "candidates": contents.header["candidates"][:2]}
    state = replace(STATE, posterior=(0.0, 1.0), flip_block=(sha(1),), credible_set=(sha(1),))
    md = render_markdown(build_report(journal.JournalContents(small, ()), state))
    assert "Posterior over the range" not in md


def test_plot_png_is_written_and_referenced(tmp_path: Path, contents: JournalContents) -> None:
    report = build_report(contents, STATE)
    out = plot_posterior(report, tmp_path / "plots" / "posterior.png")
    assert out == tmp_path / "plots" / "posterior.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    assert imread(str(out)).shape[:2] == (450, 1000)
    md = render_markdown(report, plot=out)
    images = [c for t in parse(md) if t.type == "inline" for c in t.children or []
              if c.type == "image"]
    assert [i.attrGet("src") for i in images] == [out.as_posix()]
    assert "posterior |" not in md


def test_without_matplotlib_the_text_plot_is_used(
    tmp_path: Path, contents: JournalContents, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    report = build_report(contents, STATE)
    assert plot_posterior(report, tmp_path / "p.png") is None
    assert not (tmp_path / "p.png").exists()
    md = render_markdown(report)
    fences = [t.content for t in parse(md) if t.type == "fence" and t.info == "text"]
    assert any(f.startswith("posterior |") for f in fences)


def test_text_plot_marks_the_mass_and_what_was_tested(contents: JournalContents) -> None:
    plot = text_plot(build_report(contents, STATE))
    lines = plot.splitlines()
    spark = lines[0][lines[0].index("|") + 1: lines[0].rindex("|")]
    marks = lines[1][lines[1].index("|") + 1: lines[1].rindex("|")]
    assert len(spark) == len(marks) == len(SUBJECTS)
    assert spark[FLIP] == "@" and spark[0] == " "
    assert marks[0] == "X" and marks[4] == "X" and marks[FLIP] == "o"
    assert marks[UNTESTABLE] == "u" and marks[2] == "?" and marks[7] == "o" and marks[1] == " "
    ranked = [line for line in lines if line.startswith(sha(FLIP)[:7])]
    assert ranked and "99.30%" in ranked[0]


def test_text_plot_bins_a_long_range_to_its_width(contents: JournalContents) -> None:
    report = build_report(contents, STATE)
    n = 500
    long = {**report, "posterior": [1.0 / n] * n,
            "commits": [{"sha": sha(i), "short": sha(i)[:7]} for i in range(n)],
            "tested": [{"index": 250, "verdict": "DIVERGENT"}]}
    lines = text_plot(long, width=50).splitlines()
    assert len(lines[0]) == len("posterior |") + 50 + 1
    assert lines[1].count("X") == 1


def test_posterior_of_the_wrong_length_is_a_one_line_error(contents: JournalContents) -> None:
    with pytest.raises(StateError, match="replay the journal with the same range"):
        build_report(contents, replace(STATE, posterior=(0.0, 1.0)))


def test_op_probe_lifetimes_use_the_op_table(tmp_path: Path, contents: JournalContents) -> None:
    """The focused operator check (batch-invariance-op recipe): its max |diff| fills the table."""
    cases = [{"op": "rms_norm", "dtype": "float16", "hidden": 4096, "equal": s % 2 == 0,
              "max_abs_diff": 4.8828125e-4} for s in range(16)]
    summary = summarize_cases(cases)
    verdict, message = op_verdict(summary)
    detail = {"library": "/cache/ab/_C_stable_libtorch.abi3.so", "torch": "2.11.0+cu130",
              "device": "cuda", "env": {"VLLM_BATCH_INVARIANT": "1"}, **summary,
              "row_counts": [255, 300]}
    header = {**contents.header, "recipe": {"name": "batch-invariance-op",
                                            "probe": {"kind": "op", "ops": ["rms_norm"]}}}
    path = tmp_path / journal.JOURNAL_NAME
    with Journal(path) as j:
        j.append(header)
        j.append({"type": "observation", "lifetime_id": "op-1", "commit": sha(0), "position": 0,
                  "verdict": verdict.value, "detail": detail, "message": message})
    md = render_markdown(build_report(journal.read(path), STATE))
    rows = evidence_rows(md)
    assert len(rows) == 1 and rows[0][1][0] == "DIVERGENT"
    assert rows[0][5][0] == "4.883e-04"
    assert "Max abs diff between launch sizes" in md and "Δ logprob" not in md
    assert "| rms_norm | float16 | 4096 | 8/16 |" in md  # render_op_detail's own row

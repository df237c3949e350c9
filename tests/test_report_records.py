"""One truth across files (issue 32, item 8): every report committed under docs/ is its
journal rendered by today's `bisect report`, byte for byte (scripts/regen-reports.sh writes
them), and each one is a report a maintainer can paste: Markdown that markdown-it reads as
meant, under GitHub's comment limit, its first lines free of the tool's jargon, each release
spelled one way, no path of the machine that ran it, one folded block at the end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gitrepos import run_cli
from markdown_it import MarkdownIt

from bisect_tool.report import CAP

ROOT = Path(__file__).resolve().parent.parent
JOURNALS = sorted((ROOT / "docs").rglob("*.jsonl"))


def outputs(journal: Path) -> tuple[Path, Path]:
    """Where scripts/regen-reports.sh writes a journal's Markdown and JSON reports."""
    stem = "report" if journal.stem == "journal" else f"{journal.stem}.report"
    return journal.with_name(f"{stem}.md"), journal.with_name(f"{stem}.json")


def ids(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_record_is_found() -> None:
    names = {ids(p) for p in JOURNALS}
    assert {"docs/h200/journal.jsonl", "docs/h200/2026-12-03/journal.jsonl",
            "docs/h200/releases/journal.jsonl", "docs/h200/releases/locate.jsonl",
            "docs/h200/releases/locate-fa3-pinned.jsonl"} <= names


@pytest.mark.parametrize("journal", JOURNALS, ids=ids)
def test_the_committed_report_is_its_journal_regenerated(journal: Path, tmp_path: Path) -> None:
    md, js = outputs(journal)
    for fmt, committed in (("md", md), ("json", js)):
        out = tmp_path / f"r.{fmt}"
        code, _, err = run_cli("report", "--journal", str(journal), "--format", fmt, "-o",
                               str(out))
        assert code == 0, err
        assert committed.exists(), f"{ids(committed)} missing: run scripts/regen-reports.sh"
        assert out.read_text() == committed.read_text(), (
            f"{ids(committed)} is not what `bisect report` makes of {ids(journal)} today: "
            "run scripts/regen-reports.sh")


def _tables_in_source(text: str) -> int:
    """Blocks of lines that start with "|" outside fences: each must parse as one table."""
    count, in_fence, previous = 0, False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.startswith("|") and not previous.startswith("|"):
            count += 1
        previous = "" if in_fence else line
    return count


@pytest.mark.parametrize("journal", JOURNALS, ids=ids)
def test_each_report_is_markdown_a_maintainer_can_paste(journal: Path) -> None:
    text = outputs(journal)[0].read_text()
    assert len(text) < CAP < 65_536
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    # every table in the source is read as a table (a stray "|" in a cell would split it)
    assert sum(t.type == "table_open" for t in tokens) == _tables_in_source(text)
    # fences close, the folded blocks close (every lifetime under the evidence, issue 41, and
    # the ending), and the last is the report's end (as cargo-bisect-rustc's reports end)
    assert text.count("```") % 2 == 0
    assert text.count("<details>") == text.count("</details>") <= 2
    assert text.rstrip().endswith("</details>")
    top = text[: text.index("###")]
    for jargon in ("faithful", "stand-in", "tier"):
        assert jargon not in top.lower(), jargon
    # one spelling per release: v0.27.0, never the tool's id or the package's subject, except in
    # file names (a wheel, a lifetime's log)
    spelled = re.findall(r"(?<![/\w])vllm[- ]0\.\d+\.\d+", text)
    assert not spelled, spelled
    for local in ("/tmp/", "/work/", "/home/", "/root/"):
        assert local not in text, local
    assert not re.search(r"\(0,1\) \(0,2\)", text)  # repeat pairs summarised
    assert "0+unknown" not in text


# (document, what it says, report, what the report says): the prose and the regenerated reports
# tell one story (issue 32: the README said locate was undecided at 70.8 % after the decided run)
AGREE = [
    ("docs/h200/releases/README.md", "**first good release v0.27.0, 99.6 %**",
     "docs/h200/releases/report.md", "**99.6%** that this is the first good release"),
    ("docs/h200/releases/README.md", "the server lifetimes alone give 96.0 %",
     "docs/h200/releases/report.md", "96.0% from the server lifetimes alone"),
    ("docs/h200/releases/README.md", "it would give that 10.3 % of the time",
     "docs/h200/releases/report.md", "1 clean lifetime would happen 10.3% of the time"),
    ("docs/h200/releases/README.md", "carries the change: 99.5 %**",
     "docs/h200/releases/locate-fa3-pinned.report.md", "carries the change** — **99.5%**"),
    ("docs/h200/releases/README.md", "stopped at **compiled side 70.8 %**",
     "docs/h200/releases/locate.report.md", "## Locate: not decided (the compiled side "
     "carries the change: 70.8%)"),
    ("README.md", "the compiled side carries the change at 99.5 %",
     "docs/h200/releases/locate-fa3-pinned.report.md", "**99.5%**"),
    ("README.md", "first good release 0.27.0 at 99.6 %",
     "docs/h200/releases/report.md", "**99.6%**"),
    ("docs/real-gpu.md", "Its confidence is now 97.7%",
     "docs/h200/report.md", "**97.7%** that this is the first good release"),
    ("docs/real-gpu.md", "at 99.6%, of which the lifetimes alone give 96.0%",
     "docs/h200/releases/report.md", "96.0% from the server lifetimes alone, 99.6% with"),
    ("docs/real-gpu.md", "its report, regenerated today, says 98.9%",
     "docs/h200/2026-12-03/report.md", "**98.9%** that this is the first good release"),
]


@pytest.mark.parametrize(("doc", "says", "report", "shows"), AGREE,
                         ids=[f"{a[0]}:{a[1][:30]}" for a in AGREE])
def test_the_docs_say_what_the_reports_show(doc: str, says: str, report: str,
                                            shows: str) -> None:
    assert says in " ".join((ROOT / doc).read_text().split()), (doc, says)
    assert shows in (ROOT / report).read_text(), (report, shows)

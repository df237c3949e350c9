"""Every journal the project keeps (test fixtures, the GPU records under docs/) replays, with
today's code, to the answer it ended with: the same end state, the same flip (or locate
explanation) and the same lifetimes, and its report still renders. A change to the designs or
to the journal's reading that would silently change a recorded answer fails here. (The
confidence itself moves when the search's priors do: those journals are older than the end
hypotheses, so it is not held fixed.) A locate journal replays to its explanation and to the
end state it stopped in, under the lifetimes per cell and confidence its header records; a
journal with a ``.summary.json`` beside it (the summary the code of its day printed) replays to
that too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_tool import journal as journal_mod
from bisect_tool.designs import Finish, ledger
from bisect_tool.designs.locate import LocateDesign
from bisect_tool.range import Candidate
from bisect_tool.report import build_report

ROOT = Path(__file__).resolve().parent.parent
JOURNALS = sorted(
    [*(ROOT / "tests" / "fixtures").glob("*.jsonl"), *(ROOT / "docs").rglob("*.jsonl")]
)


def test_the_records_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in JOURNALS}
    assert "docs/h200/releases/journal.jsonl" in names
    assert "docs/h200/releases/locate-fa3-pinned.jsonl" in names
    assert "tests/fixtures/journal-h200-aab2d8a.jsonl" in names


@pytest.mark.parametrize("path", JOURNALS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_kept_journal_replays_to_the_answer_it_ended_with(path: Path) -> None:
    contents = journal_mod.read(path)
    end = contents.end
    if contents.header.get("mode") == "locate":
        good, bad = (Candidate.from_dict(c) for c in contents.header["candidates"])
        design = LocateDesign(good, bad, confidence=0.99, lifetimes_per_cell=24)
        for entry in contents.entries:
            design.apply(entry)
        finding = design.finding()
        if end is None:
            return
        then = end["finding"]
        assert str(finding.explanation) == then["explanation"]
        assert finding.decided == then["decided"]
        # the end state too, asked as the run asked: its budget per cell and confidence
        header, recipe = contents.header, contents.header["recipe"]
        asked = LocateDesign(
            good, bad, confidence=float(recipe["search"]["confidence"]),
            lifetimes_per_cell=int(header["lifetimes_per_cell"]),
            controls=bool(recipe["probe"].get("controls")),
        )
        for entry in contents.entries:
            if entry.get("type") != "end":
                asked.apply(entry)
        step = asked.next_step()
        assert isinstance(step, Finish) and str(step.state) == end["state"]
        return
    state = ledger.replay(contents)
    now = state.standing().status()
    if end is None or "summary" not in end:
        assert now["state"] == "running"
        return
    then = end["summary"]
    assert now["state"] == end["state"]
    assert now["flip_block"] == then["flip_block"]
    assert now["evaluations"] == then["evaluations"]
    assert now["direction"] == then.get("direction", contents.header["direction"])
    assert build_report(contents, state.standing())  # and its report still renders
    recorded = path.with_suffix(".summary.json")
    if recorded.exists():
        printed = json.loads(recorded.read_text())
        for key in ("state", "flip_block", "direction", "evaluations"):
            assert now[key] == printed[key], key


def test_every_recorded_summary_belongs_to_a_kept_journal() -> None:
    for recorded in (ROOT / "tests" / "fixtures").glob("*.summary.json"):
        assert recorded.with_name(recorded.name.replace(".summary.json", ".jsonl")) in JOURNALS

"""The demo's closing summary (pure) and the calibration helpers it reports with."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bisect_tool.demo.calibrate import (
    LifetimeResult,
    Measurement,
    cpu_burner,
    paired_changes,
    wilson,
)
from bisect_tool.demo.summary import DemoOutcome, format_summary
from bisect_tool.values import Verdict

PLANTED = "48690ce925ed6f4cd2089f242b69f975d2516aa9"


def outcome(**changes: object) -> DemoOutcome:
    values: dict[str, object] = dict(
        found_commit=PLANTED, planted_commit=PLANTED, confidence=0.9993, p_estimate=0.52,
        p_interval=(0.41, 0.63), lifetimes=47, wall_s=63.84,
        report_path=Path("bisect-demo-out/report.md"),
        plot_path=Path("bisect-demo-out/posterior.png"),
    )
    values.update(changes)
    return DemoOutcome(**values)  # type: ignore[arg-type]


def test_summary_names_commit_confidence_p_lifetimes_and_where_the_files_are() -> None:
    text = format_summary(outcome())
    lines = text.strip().splitlines()
    assert lines[0] == "bisect demo summary"
    assert "48690ce925ed = the planted fix" in text
    assert "99.9%" in text  # percent(): one decimal unless it would read 100.0%
    assert "0.52 (90% credible interval 0.41 to 0.63)" in text
    assert "47 (plus the controls' lifetime)" in text
    assert "bisect-demo-out/report.md" in text and "bisect-demo-out/posterior.png" in text
    assert "63.8 s" in text


def test_summary_says_plainly_when_the_answer_is_wrong_or_missing() -> None:
    assert "NOT the planted fix 48690ce925ed" in format_summary(outcome(found_commit="ab" * 20))
    text = format_summary(outcome(found_commit=None, confidence=None, p_estimate=None,
                                  plot_path=None))
    assert "none (planted fix 48690ce925ed not found)" in text
    assert "unknown" in text
    assert "not written (needs matplotlib)" in text


@pytest.mark.parametrize(("k", "n", "lo", "hi"), [
    (0, 20, 0.0, 0.161), (20, 20, 0.839, 1.0), (10, 20, 0.299, 0.701), (0, 0, 0.0, 1.0),
])
def test_wilson_interval_matches_the_textbook_values(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-3)


def test_paired_changes_counts_the_lifetimes_whose_verdict_the_load_changed() -> None:
    def lifetime(seed: int | None, verdict: Verdict) -> LifetimeResult:
        return LifetimeResult(verdict, 8, 0, 2.0, late_arrivals=0, jitter_seed=seed)

    quiet = Measurement("bug", "quiet", (
        lifetime(1, Verdict.DIVERGENT), lifetime(2, Verdict.CLEAN), lifetime(3, Verdict.CLEAN),
        lifetime(None, Verdict.CLEAN),
    ))
    loaded = Measurement("bug", "loaded", (
        lifetime(3, Verdict.DIVERGENT), lifetime(1, Verdict.DIVERGENT), lifetime(2, Verdict.CLEAN),
        lifetime(4, Verdict.DIVERGENT),  # no quiet lifetime drew seed 4: not compared
    ))
    assert paired_changes(quiet, loaded) == (1, 3)  # seed 3 went clean -> divergent
    assert (quiet.p, loaded.p) == (0.25, 0.75)


def test_cpu_burner_keeps_one_process_per_core_and_stops_them_all() -> None:
    # the burner's own children: a test before this one may leave a child of this process
    # running on purpose (a session's server), which the burner neither starts nor stops
    before = set(_children())
    with cpu_burner(max_s=60) as n:
        children = [pid for pid in _children() if pid not in before]
        assert n == (os.cpu_count() or 1) and len(children) >= n
    deadline = time.monotonic() + 10  # a loop bound, not an assertion on speed
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(children)


def _children() -> list[int]:
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == me:
            found.append(int(entry.name))
    return found


def _alive(pids: list[int]) -> bool:
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            return True
    return False


# -- where the demo keeps its session, and how to bisect it by hand (issue 41) -----------------


def test_summary_ends_with_how_to_read_the_session_and_bisect_the_history_by_hand() -> None:
    text = format_summary(outcome(history="bisect-demo-out/demo-repo",
                                  recipe="bisect-demo-out/demo-recipe.toml", inconclusive=3))
    lines = text.rstrip().splitlines()
    assert "47 (3 of them inconclusive; plus the controls' lifetime)" in text
    assert "bisect-demo-out/demo-repo (its session in .git/bisect-tool)" in text
    assert lines[-3].startswith("  look at it  ") and lines[-3].endswith(
        "  cd bisect-demo-out/demo-repo && bisect status   (or bisect log, bisect report)")
    assert lines[-2].startswith("  by hand  ") and lines[-2].endswith(
        "  cd bisect-demo-out/demo-repo && bisect plan --good v0.27.0 --bad v0.26.0 --recipe "
        "../demo-recipe.toml")
    assert ("`bisect reset` and `bisect start --good v0.27.0 --bad v0.26.0 --recipe "
            "../demo-recipe.toml`") in lines[-1]


def test_a_new_demo_removes_only_what_an_earlier_demo_wrote(tmp_path: Path) -> None:
    from bisect_tool.demo import outdir
    from bisect_tool.errors import UsageError

    folder = tmp_path / "out"
    outdir.claim(folder)
    for name in outdir.OWN:
        (folder / name).mkdir() if name != outdir.RECIPE else (folder / name).write_text("x")
    (folder / outdir.REPO / "file").write_text("history")
    (folder / "notes.txt").write_text("the user's own")
    outdir.claim(folder)  # the next demo: the earlier one's entries go, nothing else
    assert sorted(p.name for p in folder.iterdir()) == [outdir.MARKER, "notes.txt"]
    # a history no demo's marker names is refused, and kept
    other = tmp_path / "other"
    (other / outdir.REPO).mkdir(parents=True)
    with pytest.raises(UsageError, match="no earlier demo wrote it"):
        outdir.claim(other)
    assert (other / outdir.REPO).is_dir()


def test_where_bisect_is_not_on_path_the_summary_says_how_to_put_it_there() -> None:
    text = format_summary(outcome(history="bisect-demo-out/demo-repo",
                                  recipe="bisect-demo-out/demo-recipe.toml",
                                  activate=".venv/bin/activate"))
    lines = text.rstrip().splitlines()
    first = next(i for i, x in enumerate(lines) if x.lstrip().startswith("first "))
    look = next(i for i, x in enumerate(lines) if "bisect status" in x)
    assert first < look
    assert lines[first].endswith(". .venv/bin/activate   (puts bisect on your PATH)")
    assert "first " not in format_summary(outcome(history="h", recipe="h/../r.toml"))

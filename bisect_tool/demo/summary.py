"""The closing lines of `bisect demo`: what a newcomer needs to see at the end (pure).

``format_summary`` takes plain values (no journal, no click), so whichever code runs the demo
calls it with what it already has; it returns the text and prints nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bisect_tool.values import percent, rate_text

# Where `bisect demo` writes its report and plot by default: relative to the current directory,
# kept after the run (a temp dir would vanish with the paths we just printed), gitignored.
DEFAULT_OUT_DIR = Path("bisect-demo-out")
REPORT_NAME = "report.md"
PLOT_NAME = "posterior.png"


@dataclass(frozen=True)
class DemoOutcome:
    """What the summary shows; every field is a plain value (None: unknown or not written)."""

    found_commit: str | None  # the flip commit the search settled on
    planted_commit: str  # the fix the demo history planted
    confidence: float | None  # posterior mass of the found commit, 0..1
    p_estimate: float | None  # median of the bad side's divergence rate
    p_interval: tuple[float, float] | None  # its 90% credible interval
    lifetimes: int  # lifetimes the search observed (the controls' own lifetime not counted)
    wall_s: float  # the bisect run's wall time
    report_path: Path | str | None
    plot_path: Path | str | None
    narrow_runs: int = 0  # the fast probe's runs (the op check), when the search narrowed
    inconclusive: int = 0  # of the lifetimes, those that could not tell (status counts the rest)
    history: str | None = None  # the generated clone, as the reader's shell names it
    recipe: str | None = None  # the completed demo recipe the run used
    good: str = "v0.27.0"  # the ends, as the run was given them
    bad: str = "v0.26.0"
    activate: str | None = None  # the virtualenv's activate script, where bisect is not on PATH


def format_summary(outcome: DemoOutcome) -> str:
    """A short, aligned block for the end of the demo's output, ending in a newline."""
    o = outcome
    if o.found_commit is None:
        found = f"none (planted fix {o.planted_commit[:12]} not found)"
    elif o.found_commit == o.planted_commit:
        found = f"{o.found_commit[:12]} = the planted fix"
    else:
        found = f"{o.found_commit[:12]}, NOT the planted fix {o.planted_commit[:12]}"
    if o.p_estimate is None:
        rate = "unknown"
    elif o.p_interval is None:
        rate = rate_text(o.p_estimate)
    else:
        lo, hi = o.p_interval
        rate = (f"{rate_text(o.p_estimate)} (90% credible interval {rate_text(lo)} to "
                f"{rate_text(hi)})")
    rows = [
        ("found commit", found),
        ("confidence", "unknown" if o.confidence is None else percent(o.confidence)),
        ("estimated p", rate + " (chance a pre-fix lifetime shows the bug)"),
        ("lifetimes", f"{o.lifetimes} ("
         + (f"{o.inconclusive} of them inconclusive; " if o.inconclusive else "")
         + "plus the controls' lifetime)"
         + (f"; {o.narrow_runs} op-check runs narrowed the range first" if o.narrow_runs
            else "")),
        ("wall time", f"{o.wall_s:.1f} s"),
        ("report", str(o.report_path) if o.report_path else "not written"),
        ("plot", str(o.plot_path) if o.plot_path else "not written (needs matplotlib)"),
    ]
    if o.history:
        # the session stays where `bisect` finds it from inside the clone (issue 41: it was in
        # a deleted temp folder, and status, log and report said "no session")
        here = f"cd {o.history} && "
        recipe = o.recipe or "demo-recipe.toml"
        ends = f"--good {o.good} --bad {o.bad} --recipe {_from_clone(recipe, o.history)}"
        rows.append(("history", f"{o.history} (its session in .git/bisect-tool)"))
        if o.activate:
            rows.append(("first", f". {o.activate}   (puts bisect on your PATH)"))
        rows += [
            ("look at it", f"{here}bisect status   (or bisect log, bisect report)"),
            ("by hand", f"{here}bisect plan {ends}"),
            ("", f"then `bisect reset` and `bisect start {ends}` (a new session)"),
        ]
    width = max(len(k) for k, _ in rows)
    lines = ["", "bisect demo summary"]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines) + "\n"


def _from_clone(path: str, clone: str) -> str:
    """``path`` as a shell inside ``clone`` names it (both as the summary shows them: relative
    to the reader's folder, or absolute)."""
    import posixpath

    if posixpath.isabs(path) or posixpath.isabs(clone):
        return path
    return posixpath.relpath(path, clone)

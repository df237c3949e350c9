"""The verdict policy, in one place: what a lifetime's evidence means to the search, one verdict
for a candidate's lifetimes, and how a search ends.

Pure: plain values in, plain values out (no git, HTTP, Docker or click). The loop
(``bisect_tool.run.owner``), the journal replay (``bisect_tool.designs.ledger``), ``bisect probe
--commit`` and
the report all call these functions, so they cannot disagree about a candidate.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

from bisect_tool.cause import one_line
from bisect_tool.values import Verdict


class EndState(enum.StrEnum):
    """How a search stands or ended; the journal's ``end`` entry stores the value."""

    RUNNING = "running"
    DONE = "done"  # the flip holds the asked confidence
    BAD_END_NEVER = "bad_end_never_reproduced"
    ENDS_CONTRADICT = "ends_contradict"  # an end showed the behaviour of the other side
    # the commits before the named flip show the bug too, more than false alarms explain: the
    # bug may start earlier at a lower rate (issue 38); no commit is named
    GOOD_SIDE_SHOWS_BUG = "good_side_shows_bug"
    # a deterministic probe (--deterministic) gave one candidate both answers, or no single flip
    # explains what it gave
    PROBE_CONTRADICTED = "probe_contradicted"
    BUDGET = "budget_exhausted"
    NO_CANDIDATE = "no_candidate_left"
    END_UNTESTABLE = "end_untestable"
    CONTROLS_FAILED = "controls_failed"

    @property
    def answered(self) -> bool:
        return self is EndState.DONE


def end_state(value: object) -> EndState:
    """The journal's end state; an unknown value (a newer tool's) reads as no answer."""
    try:
        return EndState(str(value))
    except ValueError:
        return EndState.NO_CANDIDATE


class Evidence(enum.Enum):
    """What one lifetime tells the search."""

    BUG = "bug"  # DIVERGENT: the bad behaviour was seen
    NO_BUG = "no_bug"  # CLEAN: the workload ran at the target and showed nothing
    NOTHING = "nothing"  # INCONCLUSIVE: it ran but could not tell
    CANNOT_RUN = "cannot_run"  # UNTESTABLE: no artifact, build/boot failure, ABI mismatch


_EVIDENCE = {
    Verdict.DIVERGENT: Evidence.BUG,
    Verdict.CLEAN: Evidence.NO_BUG,
    Verdict.INCONCLUSIVE: Evidence.NOTHING,
    Verdict.UNTESTABLE: Evidence.CANNOT_RUN,
}

#: consecutive INCONCLUSIVE lifetimes after which a candidate counts as untestable (or, when it
#: already gave conclusive lifetimes, is no longer tried)
MAX_INCONCLUSIVE_STREAK = 4


def evidence(verdict: Verdict) -> Evidence:
    return _EVIDENCE[verdict]


def aggregate(verdicts: Iterable[Verdict]) -> Verdict:
    """One verdict for a candidate's lifetimes, the rule the search applies.

    The bug is intermittent, so one DIVERGENT lifetime makes the candidate DIVERGENT. Otherwise
    any CLEAN lifetime makes it CLEAN: INCONCLUSIVE lifetimes are no evidence either way, and an
    UNTESTABLE after a conclusive one (a later crash) says nothing about the bug. A candidate
    with only UNTESTABLE lifetimes is UNTESTABLE; with none conclusive, INCONCLUSIVE.
    """
    seen = list(verdicts)
    if Verdict.DIVERGENT in seen:
        return Verdict.DIVERGENT
    if Verdict.CLEAN in seen:
        return Verdict.CLEAN
    if seen and all(v is Verdict.UNTESTABLE for v in seen):
        return Verdict.UNTESTABLE
    return Verdict.INCONCLUSIVE


def trusted(verdict: Verdict, controls_ok: bool | None) -> tuple[Verdict, str]:
    """A CLEAN means nothing when the controls showed the probe cannot see divergence (vLLM
    issue 51187: lifetimes on dummy weights were all clean on the buggy build)."""
    if verdict is Verdict.CLEAN and controls_ok is False:
        return Verdict.INCONCLUSIVE, "the controls failed, so clean lifetimes are not evidence"
    return verdict, ""


def controls_problem(controls: Mapping[str, Any] | None) -> str:
    """Why the controls stop the run ("" when they do not): the positive control never
    diverged, so the probe was not shown able to see the bug and a CLEAN would mean nothing
    (vLLM issue 51187: on dummy weights every lifetime of the buggy build was clean). A failed
    negative control alone does not stop the run (the probe can see divergence); the report
    shows both controls."""
    if controls is None or controls.get("ok", True):
        return ""
    positive = (controls.get("positive") or {}).get("verdict")
    if positive == Verdict.DIVERGENT:
        return ""
    problem = str(controls.get("problem", "")) or "the positive control did not diverge"
    # one line: a control whose server died carries its log tail; the first error of it says
    # why (issue 32: the whole tail reached the one-line message and the report four times)
    return f"controls failed, so a CLEAN would mean nothing: {one_line(problem)}"

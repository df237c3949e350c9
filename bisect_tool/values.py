"""Plain values shared by every stage: outcomes and what a lifetime saw.

Vocabulary (see DESIGN.md): a *candidate* is a commit under test, a *lifetime* one fresh server,
a *repeat* one pass of the workload inside a lifetime, an *observation* one lifetime's verdict.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any


class Verdict(enum.StrEnum):
    """What one lifetime (or one probe run) saw."""

    CLEAN = "clean"  # the behaviour of the good side
    DIVERGENT = "divergent"  # the bad behaviour (e.g. repeats disagree)
    INCONCLUSIVE = "inconclusive"  # ran, but could not tell (e.g. the target batch never formed)
    UNTESTABLE = "untestable"  # could not run: no artifact, build/boot failure, ABI mismatch


class Direction(enum.StrEnum):
    """Which flip the search looks for."""

    REGRESSION = "regression"  # good is older: find the first bad commit
    FIX = "fix"  # bad is older: find the first good commit


@dataclass(frozen=True)
class Observation:
    """One lifetime's result for one candidate, as the journal stores it."""

    commit: str
    verdict: Verdict
    lifetime_id: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    duration_s: float = 0.0


@dataclass(frozen=True)
class Standing:
    """Where the search stands after replaying the journal, with SHAs instead of positions: the
    one shape `status`, the progress lines, the journal's end entry and the report read
    (``bisect_tool.designs.ledger.Ledger.standing``)."""

    state: str  # a ``bisect_tool.verdict.EndState`` value
    direction: str  # "regression" | "fix"
    flip_block: tuple[str, ...]  # full SHAs (one unless untestables surround the flip)
    confidence: float
    credible_set: tuple[str, ...]  # SHAs holding 90% of the mass
    p_median: float
    p_interval: tuple[float, float]
    q_median: float
    q_interval: tuple[float, float]
    evaluations: int
    candidates_tested: int
    posterior: tuple[float, ...]  # P(flip at candidate i), aligned with header["candidates"]
    good_end_doubt: float = 0.0  # P(the flip lies beyond the good end)
    bad_end_doubt: float = 0.0  # P(the bad end does not show the bug)
    #: a tiered run (``[probe] narrow``): phase, the fast probe's flip and confidence, its runs,
    #: the confirm step's two candidates (positions), P(the fast probe is a valid stand-in)
    tiers: dict[str, Any] | None = None
    candidates: int = 0  # how many the range holds
    message: str = ""  # the end entry's message, once the search ended
    level: str = "commit"  # "commit" or "release"
    #: a flip off the main line (a release branch's bump or cherry-pick): where it lives and
    #: the main commit it copies, by SHA
    flip_provenance: dict[str, Any] = field(default_factory=dict)
    #: what the checks of the model saw (``strategy.ends.checks_seen``, SHAs for positions)
    checks: dict[str, Any] = field(default_factory=dict)

    @property
    def flip_commit(self) -> str | None:
        """The flip, where the block is one commit (untestable neighbours widen it)."""
        return self.flip_block[0] if len(self.flip_block) == 1 else None

    def status(self) -> dict[str, Any]:
        """``status --json``'s names for this standing (and the end entry's ``summary``)."""
        return {
            "tiers": self.tiers,
            "state": self.state,
            "direction": self.direction,
            "flip_commit": self.flip_commit,
            "flip_block": list(self.flip_block),
            "confidence": self.confidence,
            "credible_set": list(self.credible_set),
            "evaluations": self.evaluations,
            "candidates_tested": self.candidates_tested,
            "candidates": self.candidates,
            "p_estimate": self.p_median,
            "p_interval": list(self.p_interval),
            "q_estimate": self.q_median,
            "q_interval": list(self.q_interval),
            "posterior": list(self.posterior),
            "good_end_doubt": self.good_end_doubt,
            "bad_end_doubt": self.bad_end_doubt,
            "message": self.message,
            "level": self.level,
            "flip_provenance": dict(self.flip_provenance),
        }


_HEX_CHARS = frozenset("0123456789abcdef")


def short(ref: str) -> str:
    """How messages and ids name a candidate: a commit SHA by its first 12 hex digits, any other
    id (a release's ``vllm-0.26.0``) whole, since its prefix would not tell releases apart."""
    if len(ref) >= 12 and set(ref) <= _HEX_CHARS:
        return ref[:12]
    return ref


_RELEASE_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*?-(\d+(?:\.\d+)*(?:[a-z0-9.+_]*))$")


def spelled(ref: str, level: str) -> str:
    """How a person names a candidate on screen: in a release-level run, a release's id
    (``vllm-0.27.0``) as its tag ``v0.27.0``, the one spelling the report uses (issue 32, item
    9); anything else as it is (a branch named ``release-1.2`` too)."""
    match = _RELEASE_ID.match(ref) if level == "release" else None
    if match:
        return f"v{match.group(1)}"
    return ref


#: decimals a percentage may take to tell a probability from a certainty (past them: "> 99.9999%")
_MOST_DECIMALS = 4


def percent(x: float | None) -> str:
    """A probability as a percentage: the one rule the report, ``status``, ``replay``, the
    progress lines and the demo's summary all print with (issue 41: one confidence was printed
    99.95 %, "> 99.9 %" and "100.0 %"). One decimal, and as many more as it takes never to read
    as a certainty it is not: 0.9995 is 99.95%, 0.99996 is 99.996%, never 100.0%; 0.0004 is
    0.04%, never 0.0%. Only exactly 1 and 0 print as 100% and 0%."""
    if x is None or x != x:  # None or NaN: nothing to show
        return "-"
    if x >= 1:
        return "100%"
    if x <= 0:
        return "0%"
    for decimals in range(1, _MOST_DECIMALS + 1):
        text = f"{x * 100:.{decimals}f}"
        if float(text) not in (0.0, 100.0):
            return f"{text}%"
    return f"> {100 - 10 ** -_MOST_DECIMALS:.{_MOST_DECIMALS}f}%" if x > 0.5 else (
        f"< {10 ** -_MOST_DECIMALS:.{_MOST_DECIMALS}f}%")


def rate_text(x: float | None) -> str:
    """A rate (p, q) in two decimals, or two significant digits below 0.1, never rounded to 0 or
    1 when it is neither: 0.61, 0.034, 0.0045 (issue 41: q's median 0.0045 was printed 0.01)."""
    if x is None or x != x:
        return "-"
    if x <= 0 or x >= 1:
        return f"{min(max(x, 0.0), 1.0):.2f}"
    decimals = 2 if x >= 0.1 else 1 - math.floor(math.log10(x))
    text = f"{x:.{decimals}f}"
    while float(text) in (0.0, 1.0) and decimals < 12:
        decimals += 1
        text = f"{x:.{decimals}f}"
    return text

"""Plain values shared by every stage: outcomes and what a lifetime saw.

Vocabulary (see DESIGN.md): a *candidate* is a commit under test, a *lifetime* one fresh server,
a *repeat* one pass of the workload inside a lifetime, an *observation* one lifetime's verdict.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any


class Verdict(enum.StrEnum):
    """What one lifetime (or one probe run) saw."""

    CLEAN = "clean"  # the behaviour of the good side
    DIVERGENT = "divergent"  # the bad behaviour (e.g. repeats disagree)
    INCONCLUSIVE = "inconclusive"  # ran, but could not tell (e.g. the target batch never formed)
    UNTESTABLE = "untestable"  # could not run: no artifact, build/boot failure, ABI mismatch


class ProbeKind(enum.StrEnum):
    """What a recipe probes with (``[probe] kind``); ``bisect_tool.wiring.PROBES`` maps each to
    its evaluators."""

    SERVER = "server"  # determinism across repeats of a concurrent workload, per lifetime
    OP = "op"  # the focused kernel check on a candidate's extension (no server)
    RUN = "run"  # a command's exit status, like `git bisect run`


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
class SearchState:
    """Where the search stands after replaying the journal, with SHAs instead of positions."""

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

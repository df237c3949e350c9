"""The lookahead: which candidates to fetch or build while one is probed, and how many (K).

A build the search never asks for is the cost that matters most on vLLM (a source build is an
hour or more; issue 31: the demo built 37 commits to test 9). So the run fetches what the next
decision needs, and ahead of it at most K candidates: the ones the search would pick next after
each outcome of the candidate under test (the real strategy asked on a copy, likelier outcome
first), never a guess at the midpoints. The provider enforces the rest: at most K at a time,
and builds <= runs + K over the whole run (``bisect_tool.artifacts.provider``).

K is ``[artifacts] prefetch`` (``--prefetch``) when given. Otherwise it comes from what a fetch
costs against the time the probe would stand idle waiting for it (the run's measured costs,
``ledger.Ledger.measured_costs``; the recipe's until then):

- 0 where the artifacts may be source builds on the machine the probe keeps busy (an op check
  through ctypes runs on this host's CPUs, where host and Docker builds run too): a guess there
  slows the run it is meant to speed up, and no build machine is idle;
- else 1: one fetch overlaps the probe; a right guess saves the probe the whole wait;
- 2 (both outcomes) where two fetches fit in the time of one run, as downloads usually do.

Pure: it reads the strategy and plain values, and does no I/O.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bisect_tool.kinds import find, narrowing
from bisect_tool.strategy import BayesianStrategy, Costs, NoCandidateLeft
from bisect_tool.strategy.tiers import Tier

#: ``[artifacts] prefetch`` = -1: the run chooses K
CHOSEN_BY_RUN = -1
#: the sources a recipe has when it names none (``recipe.ArtifactSettings``)
DEFAULT_SOURCES = ("wheel-index", "release", "local", "source-build")


@dataclass(frozen=True)
class BuildFacts:
    """What decides K besides the costs."""

    #: a candidate's artifact may be a source build (the recipe lists ``source-build``)
    source_builds: bool
    #: those builds run on the machine the tier's probe keeps busy: no build machine is idle
    competes: bool


def build_facts(recipe: Mapping[str, Any], tier: Tier) -> BuildFacts:
    """From a recipe as the journal keeps it (``Recipe.to_dict()``), for one tier's probe."""
    artifacts = recipe.get("artifacts") or {}
    probe = recipe.get("probe") or {}
    sources = tuple(artifacts.get("sources") or DEFAULT_SOURCES)
    source_builds = "source-build" in sources
    kind = narrowing(probe.get("narrow")) if tier is Tier.NARROW else find(probe.get("kind"))
    # host and docker builds both run here; a probe that runs on these CPUs too (an op check
    # through ctypes) competes with them (a torch op check, a server lifetime or a Ray task
    # keeps a GPU busy instead)
    return BuildFacts(source_builds, source_builds and kind.on_cpu(probe))


def depth(setting: int, facts: BuildFacts, costs: Costs) -> int:
    """K for the next step: ``setting`` when given (>= 0), else chosen from the costs."""
    if setting >= 0:
        return setting
    if facts.competes:
        return 0
    if 2 * costs.new_candidate <= costs.lifetime:
        return 2
    return 1


def _divergent_chance(strategy: BayesianStrategy, position: int) -> float:
    """P(the next run at ``position`` shows the bug), from the posterior's medians."""
    bad_side = float(strategy.summary().bad_side[position])
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = strategy.rates()
    chance = bad_side * rates.p_median + (1 - bad_side) * rates.q_median
    # a rate posterior with no mass left to spread (every lifetime on one side) says nothing
    return chance if math.isfinite(chance) else bad_side


def picks_after(
    strategy: BayesianStrategy,
    position: int,
    k: int,
    within: tuple[int, int] | None = None,
    skip: Sequence[int] = (),
) -> list[int]:
    """Up to ``k`` candidates the search would pick after the run at ``position``, likeliest
    first: the pick after each outcome (the strategy itself, on a copy), then the picks after
    those, best-first by the chance of the path; none of ``skip`` (what the batch runs)."""
    picks: list[int] = []
    chance: dict[int, float] = {}
    # (chance of getting here, the search here, the position it runs next)
    frontier: list[tuple[float, BayesianStrategy, int]] = [(1.0, strategy, position)]
    expansions = 0
    while frontier and len(picks) < k and expansions < 4 * k:
        frontier.sort(key=lambda item: -item[0])
        reach, here, pos = frontier.pop(0)
        expansions += 1
        divergent = _divergent_chance(here, pos)
        for outcome, likely in ((True, divergent), (False, 1 - divergent)):
            twin = copy.deepcopy(here)
            twin.record(pos, outcome)
            try:
                choice = twin.select(within)
            except NoCandidateLeft:
                continue
            path = reach * likely
            frontier.append((path, twin, choice.position))
            at_hand = choice.position in here.summary().at_hand
            if choice.position not in skip and not at_hand \
                    and path > chance.get(choice.position, 0.0):
                chance[choice.position] = path
        picks = sorted(chance, key=lambda i: -chance[i])
    return picks[:k]


def lookahead(
    recipe: Mapping[str, Any],
    tier: Tier,
    strategy: BayesianStrategy,
    batch: Sequence[int],
    within: tuple[int, int] | None,
) -> list[int]:
    """The positions to fetch while ``batch`` runs: at most K (``depth``), at the strategy's
    current costs (the run's measured ones); none when K is 0, and none for a run that fetches
    nothing (no ``[artifacts]``: ``--run`` or manual), which would only pay for the picks (a
    copy of the search per outcome, every step)."""
    artifacts = recipe.get("artifacts") or {}
    if not artifacts:
        return []
    k = depth(int(artifacts.get("prefetch", CHOSEN_BY_RUN)), build_facts(recipe, tier),
              strategy.summary().costs)
    if k <= 0 or not batch:
        return []
    return picks_after(strategy, batch[0], k, within, batch)

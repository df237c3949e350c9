"""What the model's one rate per side does not see: a good end that is not good, a bug that
shows before the flip at a rate of its own, and clean lifetimes too few to tell. Pure.

The search's model explains a divergence on the good side as a false alarm (rate ``q``, small),
and a clean lifetime on the bad side as the bug's rate ``p`` falling short. Two histories fit
neither, and the model named a commit in them with confidence (issues 30 and 38):

- **A good end that is not good**, while the commits after it are fine (issue 30: only the good
  end fails; the run answered 99.5 % "both ends as given" in 3 of 3 runs). So the good end's
  lifetimes are weighed on their own as well: under "a false alarm", they come from the good
  side's rate ``q`` (learnt from the other good-side candidates); under "not a good end", from
  the bad side's rate ``p``, or, as likely, from a rate of its own (a flaky good end failing
  half its lifetimes beside a bad side failing every one fitted neither the bad side's p nor a
  false alarm, and the false alarm won, 5 of 17 "explained" at 99.7 %). Their likelihood ratio,
  with the prior ``end_doubt`` on the second, gives ``good_end_not_good``: a run keeps testing
  the good end while it blocks the asked confidence (up to ``SUSPECT_LIFETIMES_FACTOR`` times
  the ends' lifetimes), and stops with the ends contradicting once it holds it, or once those
  lifetimes did not clear it.
- **A bug that a later commit makes worse** (issue 38: in 15 % of lifetimes from c17 and in
  every one from c26, c26 named at 99.5 %, the commit before it divergent in 2 of 13 and q
  estimated at 0.03). ``good_side_check`` weighs the good side's lifetimes against a stretch
  next to the flip showing the bug at a rate of its own; a run stops with exit 9 when that
  holds, naming those commits and the older part to bisect.
- **Too few clean lifetimes to tell.** Neither check can see a bug that has not shown yet: a
  good end failing half its lifetimes was accepted after one clean lifetime in 4 of 14 runs
  (issue 38). So before a commit is named the good end must run clean 8 times: were it buggy
  at the floor ``Priors.clean_against_rate`` (one half, ``CLEAN_AGAINST_RATE``, unless the
  run sets it) or more, it would have shown it with 0.996, the search's stop threshold when
  0.99 is asked (``strategy.stop_threshold``); and the good-side candidate next to the flip 9
  times (0.998): on its way down a stretch that shows the bug at a lower rate the search may
  try the flip's neighbour more than once. ``bisect simulate``, 1,000 runs a cell: 7 and 7
  left 1.4-1.6 % wrong in the flaky-good-end and rate-step cells, 8 and 8 still 1.3 % in the
  rate step at issue 38's positions, 8 and 9 0.2-0.7 %. The report states it; lower rates are
  caught only where they show (``bisect simulate`` measures both).
- **The floor is the run's own.** A user who suspects a rarer bug before the flip sets it
  (``[search] clean_against_rate``, ``--clean-against``; the journal's header keeps it, so
  ``resume`` and ``report`` hold the same rule): 33 and 37 clean lifetimes at 0.15, 15 and 17
  at 0.3. A floor alone did not hold issue 38's 0.15 (51 of 300 simulated runs wrong): the
  commit next to the flip showed the bug once in 17-30 lifetimes and was let off, the good
  side's check taking one divergence for a false alarm (its rate prior, Beta(2, 1), leans
  high). So the commit next to the flip, once it showed the bug, must also rule out the floor
  (``rate_ruled_out``: so few divergences in so many lifetimes 0.25 % of the time at most; one
  in 52 at 0.15, one in 13 at 0.5): 0 of 300 wrong (4 of 1,000), and 2 of 300 (9 of 1,000)
  for 0.3 beside false alarms (docs/simulate-grid.txt, 2026-12-07). At the default it changed
  no measured cell.

These hold the plain search (``designs.phases.stop``); the tiered search's confirm step is not
held to the good side's check nor to the clean lifetimes and their floor: its answer rests on
the fast probe's flip as well
(``bisect_tool.strategy.tiers``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from bisect_tool.strategy import CLEAN_AGAINST_RATE, Summary, log_sequence
from bisect_tool.values import Direction


def _log_sequence(d: int, t: int, a: float, b: float, seen_d: int, seen_t: int) -> float:
    """log P(one given sequence of ``d`` divergences in ``t`` lifetimes), the rate ~ Beta(a, b)
    updated with ``seen_d`` of ``seen_t`` seen elsewhere."""
    return log_sequence(d, t, a + seen_d, b + seen_t - seen_d)


#: a good end that showed the bug is tested up to this many times ``max_end_lifetimes``: one
#: false alarm then needs ~15 clean lifetimes to stop blocking 0.99 (1 in 12 still leaves 0.7 %)
SUSPECT_LIFETIMES_FACTOR = 2


def _good_side(s: Summary) -> np.ndarray:
    """The positions on the good side of the named flip block, the nearest to the flip first,
    the good end last. A block's hypotheses differ only in the untestable commits between them,
    so those are left out: they can run no lifetime, and a stretch of them could never be told
    clean (a release the gate refused beside the flip kept the good side's check at 1.3 %
    whatever the next release ran, and the check would have run it)."""
    if s.direction is Direction.REGRESSION:  # hypothesis f puts f and later on the bad side
        return np.arange(s.block[0] - 1, -1, -1)
    return np.arange(s.block[-1], s.size)


def good_end_not_good(s: Summary) -> float:
    """P(the good end shows the bug although the flip lies inside the range | its lifetimes);
    0 while it has not shown the bug (``clean_not_earned`` says whether its clean lifetimes are
    enough)."""
    _, good = s.ends
    if good is None:
        return 0.0
    divergent, total = s.divergent, s.total
    d_g, t_g = int(divergent[good]), int(total[good])
    if not d_g:
        return 0.0
    good_side = _good_side(s)
    bad_side = np.ones(s.size, dtype=bool)
    bad_side[good_side] = False
    others = good_side[good_side != good]
    priors = s.priors
    d_b, t_b = int(divergent[bad_side].sum()), int(total[bad_side].sum())
    d_q, t_q = int(divergent[others].sum()), int(total[others].sum())
    shared = _log_sequence(d_g, t_g, priors.p_alpha, priors.p_beta, d_b, t_b)
    own = _log_sequence(d_g, t_g, priors.p_alpha, priors.p_beta, 0, 0)
    top = max(shared, own)
    as_bad = top + math.log(0.5 * math.exp(shared - top) + 0.5 * math.exp(own - top))
    as_false_alarm = _log_sequence(d_g, t_g, priors.q_alpha, priors.q_beta, d_q, t_q)
    return _posterior(priors.end_doubt, as_bad - as_false_alarm)


def _posterior(prior: float, log_ratio: float) -> float:
    """P(an alternative | the evidence), from its prior and its log likelihood ratio."""
    if prior <= 0:
        return 0.0
    log_odds = math.log(prior / (1 - prior)) + log_ratio
    if log_odds > 50:
        return 1.0
    return 1.0 / (1.0 + math.exp(-log_odds))


@dataclass(frozen=True)
class GoodSideCheck:
    """What the good side of the named flip says against the model's one rate per side: were
    the bug in the commits just before the flip too, at a lower rate of its own (a later commit
    making it worse: issue 38's bug in 15 % of lifetimes from c17 and in every one from c26),
    those commits' divergences would be that rate, not false alarms. Plain values."""

    #: P(a stretch of the good side next to the flip shows the bug at a rate of its own)
    doubt: float
    #: the share of ``doubt`` where that stretch reaches the good end (it is no good end)
    through_good_end: float
    #: the good-side candidate next to the flip: its lifetimes weigh on every such stretch
    nearest: int
    #: (position, divergent, lifetimes) of the good-side candidates that showed the bug
    diverged: tuple[tuple[int, int, int], ...]


def _log_sequences(d: np.ndarray, t: np.ndarray, a: float, b: float) -> np.ndarray:
    return np.array([log_sequence(int(x), int(y), a, b) for x, y in zip(d, t, strict=True)])


def good_side_check(s: Summary) -> GoodSideCheck:
    """Weigh "the good side's divergences are false alarms at one rate q" against "the k
    candidates next to the flip show the bug at a rate r of their own (~ Beta(p_alpha,
    p_beta), as p), the rest false alarms", k anywhere from the flip's neighbour to the good
    end, with the prior ``end_doubt`` on the second, spread evenly over k. Clean lifetimes
    count as well: the commits next to the flip earn "clean" against a lower rate too."""
    good_side = _good_side(s)
    d, t = s.divergent[good_side], s.total[good_side]
    priors = s.priors
    diverged = tuple((int(i), int(s.divergent[i]), int(s.total[i]))
                     for i in good_side if s.divergent[i])
    nearest = int(good_side[0]) if len(good_side) else s.good_end
    tested = np.flatnonzero(t)
    if not len(tested):
        return GoodSideCheck(0.0, 0.0, nearest, diverged)
    # a stretch of k candidates has the counts of the tested ones among them: the likelihood
    # changes only where a tested candidate joins, so each tested one stands for the stretches
    # that end between it and the next (those ending before the first tested one tell nothing)
    d_in, t_in = np.cumsum(d)[tested], np.cumsum(t)[tested]
    d_all, t_all = int(d.sum()), int(t.sum())
    ends_here = np.diff(np.append(tested, len(good_side)))
    log_step = (_log_sequences(d_in, t_in, priors.p_alpha, priors.p_beta)
                + _log_sequences(d_all - d_in, t_all - t_in, priors.q_alpha, priors.q_beta))
    log_clean = log_sequence(d_all, t_all, priors.q_alpha, priors.q_beta)
    untold = tested[0] / len(good_side)  # stretches before the first tested candidate
    weights = ends_here / len(good_side)
    top = max(float(log_step.max()), log_clean)
    mass = np.exp(log_step - top) * weights
    log_ratio = top + math.log(float(mass.sum()) + untold * math.exp(log_clean - top)) - log_clean
    doubt = _posterior(priors.end_doubt, log_ratio)
    # the one stretch that takes the whole good side in: the tested candidate farthest out
    # stands for it only where that is the good end itself
    whole = float(np.exp(log_step[-1] - top)) / len(good_side) if tested[-1] == len(t) - 1 else 0
    through = whole / (float(mass.sum()) + untold * math.exp(log_clean - top))
    return GoodSideCheck(doubt, through, nearest, diverged)


# the default rate the good end and the good side's candidate next to the flip must stay clean
# against before an answer is given is ``strategy.values.CLEAN_AGAINST_RATE`` (one half; the
# run's own is ``Priors.clean_against_rate``, the recipe's ``[search] clean_against_rate``,
# ``--clean-against``): a bug shown there at half the lifetimes or more is caught at the asked
# confidence (issue 38: a good end failing half its lifetimes, accepted after one clean)


def clean_lifetimes_needed(share: float, rate: float = CLEAN_AGAINST_RATE) -> int:
    """Clean lifetimes after which a candidate that shows the bug at ``rate`` would have shown
    it with probability ``share`` at least: 8 at 0.995 and 0.5 ((1/2)^8 = 0.4 %), 33 at 0.15."""
    return math.ceil(math.log(1 - share) / math.log(1 - rate) - 1e-9)


def clean_not_earned(s: Summary) -> tuple[int, ...]:
    """The good end and the good-side candidate next to the flip, those of them that have not
    yet run clean as often as they must against the run's ``clean_against_rate`` (8 and 9
    times at 0.5 when 0.99 is asked; one that showed the bug is weighed by the checks above
    instead)."""
    _, good = s.ends
    if good is None:
        return ()
    rate = s.priors.clean_against_rate
    out = []
    for i in dict.fromkeys((good, int(_good_side(s)[0]))):
        needed = clean_lifetimes_needed(s.threshold if i == good else (1 + s.threshold) / 2,
                                        rate)
        # (the flip's neighbour: half the chance, as it may be tried more than once)
        if i in s.untestable:
            continue
        d, t = int(s.divergent[i]), int(s.total[i])
        if not d:
            if t < needed:
                out.append(int(i))
        elif i != good and not rate_ruled_out(d, t, rate, (1 + s.threshold) / 2):
            out.append(int(i))
    return tuple(out)


def rate_ruled_out(divergent: int, total: int, rate: float, share: float) -> bool:
    """Whether ``divergent`` divergences in ``total`` lifetimes rule out, with ``share``, a
    candidate showing the bug at ``rate`` or more: so few would happen ``1 - share`` of the
    time at most (the binomial tail; ``clean_lifetimes_needed`` for none)."""
    tail = sum(math.comb(total, k) * rate**k * (1 - rate) ** (total - k)
               for k in range(min(divergent, total) + 1))
    return tail <= 1 - share


@dataclass(frozen=True)
class Doubts:
    """What the checks above leave open about the named flip, computed once a summary: the
    stop rules, the choice of what to run next and the stated confidence all read this one
    value, so the rule that takes them off the posterior's confidence lives here only."""

    #: P(the good end shows the bug although the flip lies inside the range)
    not_good: float
    #: the good side's check (``good_side_check``)
    good_side: GoodSideCheck
    #: whether the good side's check counts: the plain search, where the stop rules weigh it
    #: (not the confirm step, not a deterministic probe's one run a candidate)
    weighs_good_side: bool

    @property
    def total(self) -> float:
        """P(the named flip's claim fails on a ground the posterior does not weigh)."""
        step = self.good_side.doubt if self.weighs_good_side else 0.0
        return 1 - (1 - self.not_good) * (1 - step)

    def held(self, confidence: float) -> float:
        """The posterior's ``confidence`` in the flip with these doubts taken off: P(the flip
        AND both ends as given AND no bug before it at a rate of its own)."""
        return confidence * (1 - self.total)


def doubts(s: Summary, good_side: bool = True) -> Doubts:
    """The checks' doubts for ``s`` (``good_side``: the plain search, where the stop rules
    weigh the good side; a deterministic probe's one run a candidate is its answer)."""
    return Doubts(good_end_not_good(s), good_side_check(s), good_side and not s.deterministic)


def checks_seen(s: Summary, seen: Doubts | None = None) -> dict[str, Any]:
    """What the checks above saw, as plain values (positions, counts, probabilities): what the
    journal's end entry keeps and the report states."""
    seen = seen or doubts(s)
    _, good = s.ends
    ends = () if good is None else (good, int(_good_side(s)[0]))
    clean = [(int(i), int(s.total[i])) for i in dict.fromkeys(ends)
             if not s.divergent[i] and i not in s.untestable]
    return {
        "good_end_not_good": seen.not_good,
        "good_side_doubt": seen.good_side.doubt,
        "good_side_diverged": list(seen.good_side.diverged),
        "clean_against_rate": s.priors.clean_against_rate,
        # (position, clean lifetimes): the good end, then the good-side candidate next to the
        # flip; were either buggy at that rate, so many clean ones would happen (1 - rate)^n
        "clean": clean,
    }

"""How sure the answer is, in numbers a reader can check (issue 32, item 1).

The confidence a tiered run stops at comes from two things: the server lifetimes, and the op
check's narrowing (a prior that puts the flip where the op check flips, with the recipe's
``stand_in_prior``). With one clean lifetime on the good end the lifetimes alone gave 97.7 %,
below the stop threshold; the rest was the op check's prior. So the report shows both, and
the two numbers behind the lifetimes: the chance that a candidate still carrying the bug gives
as many clean lifetimes as the good side's nearest candidate did (from p's posterior, given
the bad side's lifetimes), and whether the false-alarm rate q was measured or is its prior.

Pure: counts in, numbers out. The p posterior here is the search's model (``strategy.Priors``)
conditioned on the named flip, in closed form, so a reader can redo it with a calculator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.report.names import num
from bisect_tool.strategy import Priors, log_sequence, stop_threshold


def chance_of_clean_run(divergent: int, lifetimes: int, clean: int,
                        priors: Priors | None = None) -> float:
    """P(a candidate with the bug gives ``clean`` clean lifetimes in a row), p's posterior
    given ``divergent`` of ``lifetimes`` bad-side lifetimes: a point mass at p = 1 (prior
    ``p_point_mass``) and Beta(p_alpha + d, p_beta + t - d). E[(1 - p)^k] of a Beta(a, b) is
    B(a, b + k) / B(a, b); under p = 1 it is 0."""
    priors = priors or Priors()
    d, t, k = divergent, lifetimes, clean
    a, b = priors.p_alpha + d, priors.p_beta + (t - d)
    w = priors.p_point_mass
    # evidence of the d-of-t bad-side lifetimes under each part of p's prior
    beta_evidence = math.exp(log_sequence(d, t, priors.p_alpha, priors.p_beta))
    point_evidence = 1.0 if d == t else 0.0
    weight_beta = (1 - w) * beta_evidence / ((1 - w) * beta_evidence + w * point_evidence)
    return weight_beta * math.exp(log_sequence(0, k, a, b))


def how_sure(
    answer: Mapping[str, Any],
    tested: Sequence[Mapping[str, Any]],
    tiers: Mapping[str, Any] | None,
    alone: float | None,
    search: Mapping[str, Any],
    rates: Mapping[str, bool],
) -> dict[str, Any]:
    """The "How sure" facts: the confidence from the lifetimes alone and with the op check,
    the stop threshold, the chance of the good side's clean run under the bug, p and q with
    what stands behind each, and the ends' doubts."""
    priors = Priors()
    asked = float(search.get("confidence") or 0.99)
    block = answer.get("flip_block") or []
    fix = answer.get("direction") == "fix"
    flip = int(block[0]["index"]) if block and answer.get("state") == "done" else None

    def bad_side(i: int) -> bool:
        assert flip is not None
        return i < flip if fix else i >= flip

    conclusive = [r for r in tested if r["divergent"] or r["clean"]]
    bad = [r for r in conclusive if flip is not None and bad_side(int(r["index"]))]
    good = [r for r in conclusive if flip is not None and not bad_side(int(r["index"]))]
    d = sum(int(r["divergent"]) for r in bad)
    t = sum(int(r["divergent"]) + int(r["clean"]) for r in bad)
    nearest = None
    if good and flip is not None:
        # the good side's candidate next to the flip: its clean lifetimes are the ones a
        # still-buggy candidate would have had to give
        nearest = min(good, key=lambda r: abs(int(r["index"]) - (flip if fix else flip - 1)))
    chance = None
    if nearest is not None and t and not nearest["divergent"] and nearest["clean"]:
        chance = chance_of_clean_run(d, t, int(nearest["clean"]), priors)
    gd = sum(int(r["divergent"]) for r in good)
    gt = sum(int(r["divergent"]) + int(r["clean"]) for r in good)
    tiered = bool(tiers and tiers.get("phase") == "confirm")
    return {
        "asked": asked,
        "stop_at": stop_threshold(asked),
        "confidence": num(answer.get("confidence")),
        "tiered": tiered,
        # the same journal without the op check's runs (None: no op check ran)
        "lifetimes_alone": num(alone) if tiers else num(answer.get("confidence")),
        "stand_in_probability": num((tiers or {}).get("stand_in_probability")),
        "stand_in_prior": num((tiers or {}).get("stand_in_prior")),
        "bad_side": {"divergent": d, "lifetimes": t, "names": [r["name"] for r in bad]},
        "good_side": {"divergent": gd, "lifetimes": gt, "names": [r["name"] for r in good]},
        "nearest_good": None if nearest is None else {
            "name": nearest["name"], "clean": int(nearest["clean"]),
            "divergent": int(nearest["divergent"])},
        "chance_clean_if_buggy": num(chance),
        "p": {"median": num(answer.get("p_median")),
              "interval": [num(x) for x in answer.get("p_interval") or (None, None)],
              "measured": bool(rates.get("p_has_data"))},
        "q": {"median": num(answer.get("q_median")),
              "interval": [num(x) for x in answer.get("q_interval") or (None, None)],
              "measured": bool(rates.get("q_has_data"))},
        "priors": {"p_point_mass": priors.p_point_mass, "p_alpha": priors.p_alpha,
                   "p_beta": priors.p_beta, "q_alpha": priors.q_alpha, "q_beta": priors.q_beta},
        "good_end_doubt": num(answer.get("good_end_doubt")),
        "bad_end_doubt": num(answer.get("bad_end_doubt")),
    }

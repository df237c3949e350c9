"""`bisect simulate`: plan a budget on simulated histories (the command line of ``simulate``)."""

from __future__ import annotations

import json
from typing import Any

import click

from bisect_tool.cli.common import clean_against_option
from bisect_tool.clitypes import Finite
from bisect_tool.designs.simulate import (
    GRID_FLAKY_GOOD_END,
    GRID_GOOD_END_BAD,
    GRID_N,
    GRID_P,
    GRID_Q,
    GRID_RATE_STEP,
    SimulationResult,
    simulate,
)
from bisect_tool.errors import UsageError
from bisect_tool.strategy import CLEAN_AGAINST_RATE, Costs


class RateStep(click.ParamType):
    """``A,P1,B``: positions A < B (from the good end), P1 a rate in (0, 1]."""

    name = "A,P1,B"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, float, int]:
        if isinstance(value, tuple):
            return value
        try:
            a, p1, b = str(value).split(",")
            step = (int(a), float(p1), int(b))
        except ValueError:
            self.fail(f"{value!r} is not A,P1,B (e.g. 17,0.15,26)", param, ctx)
        if not (0 <= step[0] < step[2] and 0 < step[1] <= 1):
            self.fail(f"{value!r}: need 0 <= A < B and 0 < P1 <= 1", param, ctx)
        return step


@click.command("simulate")
@click.option("--candidates", "-n", type=click.IntRange(min=2), default=512, show_default=True,
              help="Commits in the range (hypotheses for the flip).")
@click.option("--p", "p", type=Finite(0, 1, min_open=True), default=0.5, show_default=True,
              help="Chance that a bad-side lifetime shows the bug.")
@click.option("--q", "q", type=Finite(0, 1, max_open=True), default=0.01, show_default=True,
              help="False-alarm chance of a good-side lifetime.")
@click.option("--trials", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--confidence", type=Finite(0.5, 1, max_open=True), default=0.99, show_default=True)
@click.option("--cost-new", type=Finite(min=0), default=10.0, show_default=True,
              help="Cost of preparing a new candidate (download or build).")
@click.option("--cost-lifetime", type=Finite(0, min_open=True), default=1.0, show_default=True,
              help="Cost of one more lifetime.")
@click.option("--repeats", type=click.IntRange(min=1), default=7, show_default=True,
              help="Lifetimes per candidate for the fixed_repeats baseline.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--good-end-bad", is_flag=True,
              help="Histories whose given good end is in fact bad: the search must say so.")
@click.option("--rate-step", "rate_step", type=RateStep(), default=None, metavar="A,P1,B",
              help="A bug that a later commit makes worse: it shows at rate P1 from position A "
                   "and at --p from B on (counted from the good end; A = 0: the good end "
                   "too). Right is A; naming B is wrong.")
@click.option("--flaky-good-end", "flaky_good_end", type=Finite(0, 1, min_open=True),
              default=None, metavar="RATE",
              help="The good end shows the bug in this share of its lifetimes, a flip inside "
                   "the range at --p: the search must say the good end is not good.")
@clean_against_option
@click.option("--tiered", is_flag=True,
              help="Also run the tiered search: a deterministic fast probe narrows, lifetimes "
                   "confirm on both sides of its flip.")
@click.option("--narrow-cost", type=Finite(min=0), default=0.1, show_default=True,
              help="Cost of one fast-probe run, in lifetimes (--tiered).")
@click.option("--stand-in-wrong", is_flag=True,
              help="The fast probe flips elsewhere than the bug (--tiered must still be right).")
@click.option("--grid", is_flag=True,
              help="Run the target grid: p in 0.3,0.5,0.8,1 x q in 0,0.01 x N in 64,512,4096, "
                   "then the good-end-bad, rate-step and flaky-good-end cells (--trials in "
                   "every cell).")
def simulate_command(
    candidates: int,
    p: float,
    q: float,
    trials: int,
    as_json: bool,
    confidence: float,
    cost_new: float,
    cost_lifetime: float,
    repeats: int,
    seed: int,
    good_end_bad: bool,
    rate_step: tuple[int, float, int] | None,
    flaky_good_end: float | None,
    clean_against: float | None,
    tiered: bool,
    narrow_cost: float,
    stand_in_wrong: bool,
    grid: bool,
) -> None:
    """Compare the Bayesian search with classic bisection and fixed repeats on simulated ranges."""
    if q >= p:
        raise UsageError(f"--q {q} must be below --p {p} (false alarms rarer than the bug)")
    costs = Costs(cost_new, cost_lifetime)

    if sum((good_end_bad, rate_step is not None, flaky_good_end is not None)) > 1:
        raise UsageError("give one of --good-end-bad, --rate-step, --flaky-good-end")

    def run(n: int, rate_p: float, rate_q: float, count: int, **shape: Any) -> SimulationResult:
        return simulate(
            n, rate_p, rate_q, count, confidence=confidence, costs=costs, repeats=repeats,
            seed=seed, tiered=tiered or stand_in_wrong, narrow_cost=narrow_cost,
            stand_in_wrong=stand_in_wrong, clean_against_rate=clean_against, **shape,
        )

    if not grid:
        result = run(candidates, p, q, trials, good_end_bad=good_end_bad,
                     rate_step_at=rate_step, flaky_good_end_rate=flaky_good_end)
        if as_json:
            click.echo(json.dumps(result.to_dict() | {"ratios": result.ratios()}, indent=2))
        else:
            click.echo(format_result(result))
        return
    results = []
    if not as_json:
        click.echo(GRID_HEADER)
    for n in GRID_N:
        for gp in GRID_P:
            for gq in GRID_Q:
                r = run(n, gp, gq, trials)
                results.append(r.to_dict() | {"ratios": r.ratios()})
                if not as_json:
                    click.echo(grid_row(r))
    shapes: list[tuple[int, float, float, dict[str, Any]]] = [
        *((n, gp, gq, {"good_end_bad": True}) for n, gp, gq in GRID_GOOD_END_BAD),
        *((n, gp, gq, {"rate_step_at": (a, p1, b)}) for n, a, p1, b, gp, gq in GRID_RATE_STEP),
        *((n, gp, gq, {"flaky_good_end_rate": r}) for n, gp, gq, r in GRID_FLAKY_GOOD_END),
    ]
    for n, gp, gq, shape in shapes:
        r = run(n, gp, gq, trials, **shape)
        results.append(r.to_dict() | {"ratios": r.ratios()})
        if not as_json:
            click.echo(grid_row(r))
    if as_json:
        click.echo(json.dumps({"cells": results}, indent=2))


def format_result(r: SimulationResult) -> str:
    """The side-by-side table a user reads."""
    cell = " (the given good end is bad: right = saying so)" if r.good_end_bad else (
        f" ({r.shape})" if r.shape else "")
    lines = [
        f"N={r.candidates} p={r.p:g} q={r.q:g} trials={r.trials} confidence={r.confidence:g}"
        + (f" clean-against={r.clean_against_rate:g}"
           if r.clean_against_rate != CLEAN_AGAINST_RATE else "")
        + cell,
        f"{'strategy':<14}{'accuracy':>9}{'95% interval':>15}{'wrong':>7}{'no answer':>10}"
        f"{'mean evals':>12}{'p95 evals':>11}{'mean cost':>11}",
    ]
    for name, s in r.strategies.items():
        lo, hi = s.accuracy_interval
        lines.append(
            f"{name:<14}{s.accuracy:>9.3f}{f'{lo:.3f}-{hi:.3f}':>15}{s.errors:>7}"
            f"{s.no_answer:>10}{s.mean_evaluations:>12.1f}{s.p95_evaluations:>11.0f}"
            f"{s.mean_cost:>11.1f}"
        )
    lb = r.lower_bound
    lines.append(
        f"{'lower bound':<14}{'>=0.99':>9}{'':>15}{'':>7}{'':>10}{lb.evaluations:>12.1f}{'':>11}"
        f"{lb.cost:>11.1f}"
    )
    ratios = r.ratios()
    b = r.strategies["bayes"]
    lines.append(
        f"bayes cost / lower bound = {ratios['bayes_over_lower_bound']:.2f}; "
        f"bayes cost / classic cost = {ratios['bayes_over_classic']:.2f}; "
        f"bayes mean stated confidence {r.bayes_reported_confidence:.4f}"
    )
    if b.no_answer:
        lines.append(f"bayes stopped without an answer in {b.no_answer} of {r.trials} runs, "
                     f"after {b.no_answer_evaluations:.1f} lifetimes on average (not wrong)")
    if "bayes_over_tiered" in ratios:
        lines.append(
            f"lifetimes only (bayes) cost / tiered cost = {ratios['bayes_over_tiered']:.2f} "
            "(tiered: a deterministic fast probe narrows, lifetimes confirm; its cost counts "
            "the fast probe's runs)"
        )
    return "\n".join(lines)


def grid_row(r: SimulationResult) -> str:
    b, c = r.strategies["bayes"], r.strategies["classic"]
    ratios = r.ratios()
    return (
        f"{r.candidates:>5} {r.p:>4g} {r.q:>5g} {r.trials:>6} {b.accuracy:>6.3f} "
        f"{b.errors:>5} {b.no_answer:>6} {b.no_answer_evaluations:>6.1f} "
        f"{b.accuracy_interval[0]:>6.3f} "
        f"{r.bayes_reported_confidence:>7.4f} {b.mean_evaluations:>7.1f} {b.p95_evaluations:>5.0f} "
        f"{b.mean_cost:>7.1f} {r.lower_bound.cost:>6.1f} {ratios['bayes_over_lower_bound']:>6.2f} "
        f"{c.accuracy:>6.3f} {c.mean_cost:>6.1f} {ratios['bayes_over_classic']:>6.2f} "
        f"{r.strategies['fixed_repeats'].accuracy:>6.3f}"
        + (f"  {r.shape}" if r.shape else "")
    )


GRID_HEADER = (
    "    N    p     q trials  b.acc b.err b.none n.eval b.lo95  b.conf  b.eval   p95  b.cost  "
    "lower  b/low  c.acc c.cost  b/cls  fr.acc"
)

"""``bisect locate``: which side carries the change, before any bisect (and ``start --locate``,
which runs it first). The swap matrix itself is ``bisect_tool.run.locate``'s."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from bisect_tool.cli.common import (
    ends_options,
    gpu_list,
    run_options,
    state_dir_of,
    with_flags,
)
from bisect_tool.clitypes import Finite
from bisect_tool.errors import NoAnswer
from bisect_tool.events import Observer
from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.run.progress import watching
from bisect_tool.run.request import StartRequest
from bisect_tool.values import percent


def locate_before_bisect(
    recipe: recipe_mod.Recipe, good: str, bad: str, repo: Path, request: StartRequest,
    releases: object, observer: Observer,
) -> StartRequest:
    """``start --locate``: the swap matrix first, then the bisect it calls for: of the
    compiled side (the request as it is), or, when the Python side carries the change, of whole
    commits (each candidate's own Python side with its compiled files, issue 40: swapping _C
    cannot find a Python change); nothing for any other answer."""
    import dataclasses

    from bisect_tool.run import locate as locate_mod
    from bisect_tool.strategy.matrix import Explanation

    state_dir = request.journal_path.parent
    outcome = locate_mod.locate(
        locate_mod.LocateRequest(good, bad, recipe, state_dir,
                                 repo=repo if releases is None else None, releases=releases),
        observer,
    )
    click.echo(locate_mod.render(outcome))
    finding = outcome.finding
    wanted = (Explanation.COMPILED, Explanation.PYTHON)
    if not finding.decided or finding.explanation not in wanted:
        raise NoAnswer(
            f"bisect locate says {finding.explanation} ({percent(finding.probability)}): "
            "nothing to bisect on one side (see above)"
        )
    click.echo("")
    if finding.explanation is Explanation.COMPILED:
        return request
    if releases is not None:
        raise NoAnswer(
            "bisect locate says the Python side; whole commits need a clone: run `bisect start "
            f"--locate --good {good} --bad {bad} --recipe {recipe.name}` in your vLLM clone"
        )
    whole = locate_mod.whole_commits(recipe)
    click.echo(f"the Python side carries it: bisecting whole commits (each candidate's own "
               f"{whole.artifacts.package}/ with its compiled files)\n")
    return dataclasses.replace(request, recipe=whole)


@click.command()
@ends_options(
    "An end with the good behaviour (ref or release).", "An end with the bad behaviour.",
    recipe_required=True,
)
@click.option("--releases", is_flag=True, help="The ends are releases of the recipe's package.")
@click.option("--index-url", default=None, help="With --releases: the simple index to use.")
@click.option("--good-python", type=click.Path(path_type=Path), default=None,
              help="The good end's Python side: a folder holding its package (site-packages).")
@click.option("--bad-python", type=click.Path(path_type=Path), default=None,
              help="The bad end's Python side: a folder holding its package.")
@click.option("--lifetimes-per-cell", type=click.IntRange(min=1), default=24, show_default=True,
              help="Most lifetimes of one cell.")
@click.option("--confidence", type=Finite(0, 1, min_open=True, max_open=True),
              default=None, help="Stop when one explanation holds this posterior mass.")
@click.option("--gpus", default=None, help="GPUs for lifetimes, e.g. 0,1.")
@click.option("--python", "python_exe", default=None, help="Interpreter of the Python sides.")
@click.option("--no-controls", is_flag=True, help="Skip the positive/negative controls.")
@click.option("--json", "as_json", is_flag=True, help="Print the finding as JSON.")
@run_options
def locate(
    good: str, bad: str, recipe_name: str, releases: bool, index_url: str | None,
    good_python: Path | None, bad_python: Path | None, lifetimes_per_cell: int,
    confidence: float | None, gpus: str | None, python_exe: str | None, no_controls: bool,
    as_json: bool, quiet: bool, verbose: bool, repo: Path, state_dir: Path | None,
) -> None:
    """Which side carries the change: the probe on {good, bad} Python side x {good, bad}
    compiled side, before any bisect. Exit 0 with an answer, 9 below the asked confidence."""
    from bisect_tool.run import locate as locate_mod
    from bisect_tool.run.request import ReleaseRequest
    from bisect_tool.strategy.matrix import CELLS, Side

    recipe = with_flags(
        recipe_mod.load(recipe_name),
        search={"confidence": confidence},
        runtime={"python": python_exe, "gpus": gpu_list(gpus)},
        no_controls=no_controls,
    )
    python_dirs = {side: path for side, path in ((Side.GOOD, good_python),
                                                  (Side.BAD, bad_python)) if path is not None}
    request = locate_mod.LocateRequest(
        good, bad, recipe, state_dir_of(repo, state_dir, releases=releases),
        repo=None if releases else repo,
        releases=ReleaseRequest(index_url=index_url or "") if releases else None,
        python_dirs=python_dirs, lifetimes_per_cell=lifetimes_per_cell,
        command=("bisect", *sys.argv[1:]),
    )
    with watching(quiet, verbose) as observer:
        outcome = locate_mod.locate(request, observer)
    f = outcome.finding
    if as_json:
        click.echo(json.dumps({
            "explanation": str(f.explanation), "probability": f.probability,
            "decided": f.decided, "posterior": {str(k): v for k, v in f.posterior.items()},
            "tied": [str(t) for t in f.tied], "good": outcome.good.sha, "bad": outcome.bad.sha,
            "cells": {c.key: {"divergent": outcome.counts[c].divergent,
                              "lifetimes": outcome.counts[c].total,
                              "untestable": outcome.counts[c].untestable or None}
                      for c in CELLS},
            "lifetimes": outcome.lifetimes, "next": outcome.next_step,
            "journal": str(outcome.journal),
        }, indent=2))
    else:
        click.echo(locate_mod.render(outcome))
    if not f.decided:
        raise NoAnswer(
            f"no explanation holds the asked confidence ({f.explanation} at "
            f"{percent(f.probability)}); raise --lifetimes-per-cell or see the cells above"
        )

"""``bisect start``, ``bisect plan`` and ``bisect resume``: the commands that run a bisect (or
plan one). They parse flags into a ``request.StartRequest`` and print the outcome; the run owner
(``bisect_tool.run.owner``) does the rest."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from bisect_tool.cli.common import (
    clean_against_option,
    ends_options,
    gpu_list,
    journal_path,
    print_outcome,
    progress_options,
    repo_option,
    run_options,
    state_dir_of,
    state_locked,
    state_option,
    with_flags,
)
from bisect_tool.cli.locate import locate_before_bisect
from bisect_tool.clitypes import Finite
from bisect_tool.errors import UsageError
from bisect_tool.journal import JOURNAL_NAME
from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.run.progress import watching
from bisect_tool.run.request import ReleaseRequest, StartRequest


@click.command()
@ends_options(
    "A commit with the good behaviour (tag, branch, SHA).", "A commit with the bad behaviour.",
    recipe_required=False,
)
@click.option("--run", "run_command", default=None, help="Generic probe, like `git bisect run`.")
@click.option(
    "--run-timeout", type=Finite(min=0), default=0.0,
    help="Seconds before --run aborts (0: no limit)."
)
@click.option(
    "--test-from", "test_from", default=None, metavar="REF",
    help="With --run: take the --test-file files from this (newer) commit and put them into "
    "every candidate's worktree before CMD runs (a regression test exists only from its fix "
    "on); $BISECT_TEST_FROM names the exported folder.",
)
@click.option(
    "--test-file", "test_files", multiple=True, metavar="PATH",
    help="With --test-from: a test file (or folder) at REF, as `git show REF:PATH` names it.",
)
@click.option("--path", "paths", multiple=True, help="Only commits touching these paths.")
@click.option(
    "--mainline", default=None, metavar="REF",
    help="The main line releases branch from (default: the remote's main, else main): release "
    "tags map to where their branch left it, and commits off it have no per-commit wheel.",
)
@click.option(
    "--confidence",
    type=Finite(0, 1, min_open=True, max_open=True),
    default=None,
    help="Stop at this posterior mass.",
)
@click.option(
    "--max-evaluations", type=click.IntRange(min=1), default=None, help="Budget of lifetimes."
)
@clean_against_option
@click.option("--backend", type=click.Choice(["local", "docker", "ray"]), default=None)
@click.option("--ray-address", default=None, help="Ray cluster for --backend ray (HOST:PORT).")
@click.option("--gpus", default=None, help="GPUs for lifetimes, e.g. 0,1,2,3.")
@click.option("--python", "python_exe", default=None, help="Interpreter of the pinned stack.")
@click.option("--pinned-dir", default=None, help="Directory holding the pinned package.")
@click.option("--model", default=None, help="Model path or name for the server.")
@click.option(
    "--cost-new", type=Finite(min=0), default=None, help="Cost of a new candidate."
)
@click.option(
    "--cost-lifetime",
    type=Finite(0, min_open=True),
    default=None,
    help="Cost of another lifetime.",
)
@click.option("--no-controls", is_flag=True, help="Skip the positive/negative controls.")
@click.option(
    "--deterministic", is_flag=True,
    help="The probe gives a candidate the same answer every run (git bisect's contract): one "
    "run a candidate, at most ceil(log2 N) + 2 runs; a run that contradicts itself stops with "
    "exit 9. The recipe's [probe] deterministic.",
)
@click.option(
    "--no-narrow", is_flag=True,
    help="Lifetimes only: skip the recipe's fast probe ([probe] narrow).",
)
@click.option(
    "--releases", is_flag=True,
    help="Bisect the released versions of the recipe's package (--good/--bad are versions: "
    "0.27.0 or v0.27.0); no clone needed. With --repo it goes on to the commits between the "
    "two releases it ends between.",
)
@click.option("--pre", is_flag=True, help="With --releases: pre-releases are candidates too.")
@click.option(
    "--include-yanked", is_flag=True, help="With --releases: yanked releases are candidates too."
)
@click.option(
    "--index-url", default=None,
    help="With --releases: the simple index to list and fetch releases from (default: pip's).",
)
@click.option(
    "--prefetch", type=click.IntRange(min=0), default=None,
    help="Fetch or build at most K candidates ahead of the one the search needs next (a run "
    "then builds at most K more than it runs; default: chosen from the run's costs, 0 for "
    "source builds on the machine the probe keeps busy). The recipe's [artifacts] prefetch.",
)
@click.option(
    "--dry-run", is_flag=True,
    help="Plan only (the same as `bisect plan`): the candidates, where each artifact comes "
    "from, the gate, the expected cost and the environment checks; writes nothing.",
)
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON.")
@click.option(
    "--p", "assumed_p", type=click.FloatRange(0, 1, min_open=True), default=None,
    help="With --dry-run: the p to simulate the search at (default: the prior's mean).",
)
@click.option(
    "--trials", type=click.IntRange(min=1), default=None,
    help="With --dry-run: simulated runs behind the expected cost (default 16).",
)
@click.option(
    "--locate", "locate_first", is_flag=True,
    help="First run `bisect locate` on the two ends; bisect only if the compiled side "
    "carries the change.",
)
@run_options
def start(
    good: str,
    bad: str,
    recipe_name: str | None,
    run_command: str | None,
    run_timeout: float,
    test_from: str | None,
    test_files: tuple[str, ...],
    paths: tuple[str, ...],
    mainline: str | None,
    confidence: float | None,
    max_evaluations: int | None,
    clean_against: float | None,
    backend: str | None,
    ray_address: str | None,
    gpus: str | None,
    python_exe: str | None,
    pinned_dir: str | None,
    model: str | None,
    cost_new: float | None,
    cost_lifetime: float | None,
    no_controls: bool,
    deterministic: bool,
    no_narrow: bool,
    releases: bool,
    pre: bool,
    include_yanked: bool,
    index_url: str | None,
    prefetch: int | None,
    dry_run: bool,
    as_json: bool,
    assumed_p: float | None,
    trials: int | None,
    locate_first: bool,
    quiet: bool,
    verbose: bool,
    repo: Path,
    state_dir: Path | None,
) -> None:
    """Start a bisect. With --recipe or --run it runs unattended to the end; with neither it
    prints the next candidate to judge with `bisect good|bad|skip`."""
    from bisect_tool.run import owner as run

    _check_run_command(run_command)
    _check_pairs(run_command, test_from, test_files, releases, pre, include_yanked, index_url,
                 paths, mainline)
    release_request = None
    if releases:
        release_request = ReleaseRequest(
            index_url=index_url or "", pre=pre, yanked=include_yanked, then_commits=repo_given()
        )
    recipe_obj = recipe_mod.load(recipe_name) if recipe_name else None
    if prefetch is not None and recipe_obj is None:
        raise UsageError("--prefetch goes with --recipe (a --run or manual bisect fetches nothing)")
    if recipe_obj is not None:
        recipe_obj = with_flags(
            recipe_obj,
            artifacts={"prefetch": prefetch},
            search={
                "confidence": confidence, "max_evaluations": max_evaluations,
                "cost_new_candidate": cost_new, "cost_lifetime": cost_lifetime,
                "clean_against_rate": clean_against,
            },
            runtime={
                "backend": backend, "python": python_exe, "pinned_package_dir": pinned_dir,
                "model": model, "weights": "" if model else None, "gpus": gpu_list(gpus),
                "ray_address": ray_address,
            },
            no_controls=no_controls,
            no_narrow=no_narrow,
        )
        if mainline:
            recipe_obj = recipe_obj.override("range", mainline=mainline)
        if deterministic:
            recipe_obj = recipe_obj.override("probe", deterministic=True)
    request = StartRequest(
        repo=repo,
        good=good,
        bad=bad,
        journal_path=state_dir_of(repo, state_dir, releases=releases) / JOURNAL_NAME,
        recipe=recipe_obj,
        run_command=run_command,
        run_timeout=run_timeout,
        paths=paths,
        mainline=mainline,
        search_overrides=_search_overrides(confidence, max_evaluations, cost_new, cost_lifetime,
                                           clean_against),
        deterministic=deterministic,
        command=("bisect", *sys.argv[1:]),
        releases=release_request,
        test_from=test_from,
        test_files=test_files,
    )
    if dry_run:
        if locate_first:
            raise UsageError("--dry-run plans the bisect alone; drop --locate (or run `bisect "
                             "locate` itself)")
        _plan(request, as_json, assumed_p, trials)
        return
    if as_json or assumed_p is not None or trials is not None:
        raise UsageError("--json, --p and --trials go with --dry-run (or `bisect plan`)")
    with watching(quiet, verbose) as observer:
        if locate_first:
            if recipe_obj is None:
                raise UsageError("--locate needs --recipe (it boots the recipe's server)")
            request = locate_before_bisect(recipe_obj, good, bad, repo, request,
                                           release_request, observer)
        outcome = run.start(request, observer)
    print_outcome(outcome)



def _check_pairs(
    run_command: str | None,
    test_from: str | None,
    test_files: tuple[str, ...],
    releases: bool,
    pre: bool,
    include_yanked: bool,
    index_url: str | None,
    paths: tuple[str, ...],
    mainline: str | None,
) -> None:
    """The flags that go only with another (or never with it)."""
    if (test_from is None) != (not test_files):
        raise UsageError("--test-from REF and --test-file PATH go together (the file(s) to take "
                         "from REF)")
    if test_from is not None and run_command is None:
        raise UsageError("--test-from goes with --run CMD (the command that runs the test at "
                         "each candidate)")
    if (pre or include_yanked or index_url) and not releases:
        raise UsageError("--pre, --include-yanked and --index-url go with --releases")
    if releases and paths:
        raise UsageError("--path filters commits; a release-level bisect has none (drop --path)")
    if releases and mainline and not repo_given():
        raise UsageError("--mainline places commits; a release-level bisect without --repo has "
                         "none (drop --mainline, or give --repo CLONE)")


def repo_given() -> bool:
    """Whether --repo was on the command line (not its default, the current folder)."""
    ctx = click.get_current_context()
    return ctx.get_parameter_source("repo") is not click.core.ParameterSource.DEFAULT


def _plan(request: StartRequest, as_json: bool, p: float | None, trials: int | None) -> None:
    """``start --dry-run`` / ``bisect plan``: print the plan; exit 8 when the environment lacks
    what the run needs (the plan says what and how to fix it)."""
    from bisect_tool.errors import InfrastructureError
    from bisect_tool.run import plan as plan_mod

    made = plan_mod.make(request, p=p, trials=trials or plan_mod.TRIALS)
    click.echo(json.dumps(made.to_dict(), indent=2) if as_json else plan_mod.render(made))
    missing = [c for c in made.checks if c.required and not c.ok]
    if missing:
        raise InfrastructureError(
            f"not ready: {missing[0].name}: {missing[0].detail}; fix: {missing[0].fix}"
        )


def _check_run_command(run_command: str | None) -> None:
    """``--run ""`` is a mistake, not manual mode; a literal secret would reach the journal."""
    from bisect_tool import redact

    if run_command is not None and not run_command.strip():
        raise UsageError(
            "--run needs a command (e.g. --run ./probe.sh); leave --run out for manual mode"
        )
    secret = redact.literal_secret(run_command or "")
    if secret:
        raise UsageError(
            f"--run holds {secret} written out; export it and refer to it as $NAME, so it "
            "stays out of the journal and the report"
        )


def _search_overrides(*values: float | int | None) -> dict[str, object]:
    names = ("confidence", "max_evaluations", "cost_new_candidate", "cost_lifetime",
             "clean_against_rate")
    return {n: v for n, v in zip(names, values, strict=True) if v is not None}


@click.command()
@progress_options
@repo_option
@state_option
@state_locked(create=False)
def resume(quiet: bool, verbose: bool, repo: Path, state_dir: Path | None) -> None:
    """Continue a bisect from its journal (after a crash or Ctrl-C)."""
    from bisect_tool.run import owner as run

    with watching(quiet, verbose) as observer:
        outcome = run.resume(journal_path(repo, state_dir), observer)
    print_outcome(outcome)


def plan_command() -> click.Command:
    """``bisect plan``: ``start``'s flags, always a dry run."""
    params = [p for p in start.params if p.name != "dry_run"]

    def callback(**kwargs: object) -> None:
        assert start.callback is not None
        start.callback(dry_run=True, **kwargs)

    return click.Command(
        "plan", callback=callback, params=params,
        help="What `bisect start` with these flags would do, before it spends anything: the "
        "candidates, where each one's artifact comes from (cache, wheel index, release wheel, "
        "source build; nothing fetched or built), which ones the gate rejects, the expected op "
        "runs, lifetimes, builds and wall time (the search simulated at an assumed p), and the "
        "environment checks. Writes nothing. Exit 8 when the environment is not ready.",
        context_settings={"help_option_names": ["-h", "--help"]},
    )


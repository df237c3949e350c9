"""The `bisect` command line. Errors are caught once here: one line, an exit code, no traceback."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from bisect_tool import __version__
from bisect_tool import journal as journal_mod
from bisect_tool import recipe as recipe_mod
from bisect_tool.artifacts.cli import artifacts_group
from bisect_tool.clitypes import Finite
from bisect_tool.commit_probe import probe_commit
from bisect_tool.completion import complete_recipe
from bisect_tool.demo.cli import demo_command
from bisect_tool.errors import (
    BisectError,
    NoAnswer,
    RangeError,
    StateDirUnusable,
    StateError,
    UsageError,
    exit_code_table,
)
from bisect_tool.events import Observer
from bisect_tool.journal import JOURNAL_NAME
from bisect_tool.probes.cli import probe_command, register_commit_prober
from bisect_tool.run import Outcome, StartRequest
from bisect_tool.runtime.cli import model_group
from bisect_tool.simulate_cli import simulate_command
from bisect_tool.values import Verdict, short
from bisect_tool.verdict import EndState, end_state


def _exit_codes_epilog() -> str:
    # \b keeps click from rewrapping the table (generated from errors.py: it cannot drift).
    return "\b\nExit codes:\n" + exit_code_table(markdown=False)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=_exit_codes_epilog(),
)
@click.version_option(__version__, prog_name="bisect")
def cli() -> None:
    """Find the vLLM commit that introduced or fixed an intermittent bug in compiled kernels."""


def _state_dir(repo: Path, state_dir: Path | None, *, releases: bool = False) -> Path:
    """Default: inside the target repository's git dir, as git bisect keeps its state. Outside
    a clone, a release-level bisect (which needs none) keeps it in the user state dir, where
    the other commands then find it."""
    if state_dir is not None:
        if state_dir.exists() and not state_dir.is_dir():
            raise StateDirUnusable(
                f"--state-dir {state_dir} is a file, not a folder; pass a folder you can write"
            )
        return state_dir
    from bisect_tool.statedir import STATE_SUBDIR, find_clone

    clone = find_clone(repo)
    if clone is None:
        outside = _user_state_dir()
        if releases or (outside / JOURNAL_NAME).exists():
            return outside
        raise RangeError(
            f"{repo} is not a git repository (nor inside one); pass --repo PATH pointing at "
            "your vLLM clone"
        )
    return clone.git_dir / STATE_SUBDIR


def _user_state_dir() -> Path:
    """Where a bisect without a clone keeps its journal ($BISECT_STATE_DIR, else the
    platform's user state dir: ~/.local/state/bisect on Linux)."""
    import os

    if os.environ.get("BISECT_STATE_DIR"):
        return Path(os.environ["BISECT_STATE_DIR"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_state_dir("bisect", appauthor=False))


def _journal_path(repo: Path, state_dir: Path | None) -> Path:
    return _state_dir(repo, state_dir) / JOURNAL_NAME


def _top_of_clone(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """``--repo`` (default: the current folder) as the top of the clone it lies in, found as
    git finds it: a subdirectory or a linked worktree works like the clone's top. Outside any
    clone the path is kept (a release-level bisect needs none; the others say so)."""
    from bisect_tool.statedir import find_clone

    clone = find_clone(value)
    return clone.top if clone is not None else value


repo_option = click.option(
    "--repo",
    "repo",
    type=click.Path(path_type=Path),
    default=Path("."),
    show_default=True,
    callback=_top_of_clone,
    help="The target repository (your vLLM clone; any folder inside it).",
)
state_option = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the journal and logs live (default: <repo>/.git/bisect-tool).",
)


def progress_options(fn: Callable[..., None]) -> Callable[..., None]:
    fn = click.option("-v", "--verbose", is_flag=True,
                      help="Plain progress lines, one per lifetime too.")(fn)
    return click.option("-q", "--quiet", is_flag=True,
                        help="No progress; only the answer and errors.")(fn)




def _progress(message: str) -> None:
    click.echo(message, err=True)


def _state_locked(create: bool = True) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Hold the state dir's lock for the whole command (one bisect per state dir; see
    statelock.py). ``create=False``: a command that needs an existing session runs unlocked
    when there is no state dir at all, and says so itself."""

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def command(*args: object, **kwargs: object) -> None:
            from bisect_tool import statelock

            path = _state_dir(
                kwargs["repo"], kwargs["state_dir"],  # type: ignore[arg-type]
                releases=bool(kwargs.get("releases")),
            )
            if kwargs.get("dry_run"):  # `bisect plan` writes nothing, not even the lock
                return fn(*args, **kwargs)
            if not create and not path.is_dir():
                return fn(*args, **kwargs)
            with statelock.hold(path, fn.__name__, notice=_progress):
                return fn(*args, **kwargs)

        return command

    return wrap


@cli.command()
@click.option("--good", required=True, help="A commit with the good behaviour (tag, branch, SHA).")
@click.option("--bad", required=True, help="A commit with the bad behaviour.")
@click.option(
    "--recipe", "recipe_name", default=None, help="Bundled recipe name or TOML path.",
    shell_complete=complete_recipe,
)
@click.option("--run", "run_command", default=None, help="Generic probe, like `git bisect run`.")
@click.option(
    "--run-timeout", type=Finite(min=0), default=0.0,
    help="Seconds before --run aborts (0: no limit)."
)
@click.option("--path", "paths", multiple=True, help="Only commits touching these paths.")
@click.option(
    "--confidence",
    type=Finite(0, 1, min_open=True, max_open=True),
    default=None,
    help="Stop at this posterior mass.",
)
@click.option(
    "--max-evaluations", type=click.IntRange(min=1), default=None, help="Budget of lifetimes."
)
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
@progress_options
@repo_option
@state_option
@_state_locked()
def start(
    good: str,
    bad: str,
    recipe_name: str | None,
    run_command: str | None,
    run_timeout: float,
    paths: tuple[str, ...],
    confidence: float | None,
    max_evaluations: int | None,
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
    from bisect_tool import run

    _check_run_command(run_command)
    if (pre or include_yanked or index_url) and not releases:
        raise UsageError("--pre, --include-yanked and --index-url go with --releases")
    if releases and paths:
        raise UsageError("--path filters commits; a release-level bisect has none (drop --path)")
    release_request = None
    if releases:
        ctx = click.get_current_context()
        explicit_repo = ctx.get_parameter_source("repo") is not click.core.ParameterSource.DEFAULT
        release_request = run.ReleaseRequest(
            index_url=index_url or "", pre=pre, yanked=include_yanked, then_commits=explicit_repo
        )
    recipe_obj = recipe_mod.load(recipe_name) if recipe_name else None
    if prefetch is not None and recipe_obj is None:
        raise UsageError("--prefetch goes with --recipe (a --run or manual bisect fetches nothing)")
    if recipe_obj is not None:
        recipe_obj = recipe_obj.override("artifacts", prefetch=prefetch)
        recipe_obj = recipe_obj.override(
            "search",
            confidence=confidence,
            max_evaluations=max_evaluations,
            cost_new_candidate=cost_new,
            cost_lifetime=cost_lifetime,
        )
        recipe_obj = recipe_obj.override(
            "runtime",
            backend=backend,
            python=python_exe,
            pinned_package_dir=pinned_dir,
            model=model,
            weights="" if model else None,
            gpus=tuple(g for g in gpus.split(",") if g) if gpus else None,
            ray_address=ray_address,
        )
        if no_controls:
            recipe_obj = recipe_obj.override("probe", controls=False)
        if no_narrow:
            recipe_obj = recipe_obj.override("probe", narrow="")
        if deterministic:
            recipe_obj = recipe_obj.override("probe", deterministic=True)
    request = run.StartRequest(
        repo=repo,
        good=good,
        bad=bad,
        journal_path=_state_dir(repo, state_dir, releases=releases) / JOURNAL_NAME,
        recipe=recipe_obj,
        run_command=run_command,
        run_timeout=run_timeout,
        paths=paths,
        search_overrides=_search_overrides(confidence, max_evaluations, cost_new, cost_lifetime),
        deterministic=deterministic,
        command=("bisect", *sys.argv[1:]),
        releases=release_request,
    )
    if dry_run:
        if locate_first:
            raise UsageError("--dry-run plans the bisect alone; drop --locate (or run `bisect "
                             "locate` itself)")
        _plan(request, as_json, assumed_p, trials)
        return
    if as_json or assumed_p is not None or trials is not None:
        raise UsageError("--json, --p and --trials go with --dry-run (or `bisect plan`)")
    with _watching(quiet, verbose) as observer:
        if locate_first:
            if recipe_obj is None:
                raise UsageError("--locate needs --recipe (it boots the recipe's server)")
            _locate_first(recipe_obj, good, bad, repo, request, release_request, observer)
        outcome = run.start(request, observer)
    _print_outcome(outcome)


def _plan(request: StartRequest, as_json: bool, p: float | None, trials: int | None) -> None:
    """``start --dry-run`` / ``bisect plan``: print the plan; exit 8 when the environment lacks
    what the run needs (the plan says what and how to fix it)."""
    from bisect_tool import plan as plan_mod
    from bisect_tool.errors import InfrastructureError

    made = plan_mod.make(request, p=p, trials=trials or plan_mod.TRIALS)
    click.echo(json.dumps(made.to_dict(), indent=2) if as_json else plan_mod.render(made))
    missing = [c for c in made.checks if c.required and not c.ok]
    if missing:
        raise InfrastructureError(
            f"not ready: {missing[0].name}: {missing[0].detail}; fix: {missing[0].fix}"
        )


def _locate_first(
    recipe: recipe_mod.Recipe, good: str, bad: str, repo: Path, request: object,
    releases: object, observer: Observer,
) -> None:
    """``start --locate``: the swap matrix first; the bisect follows only when the compiled
    side carries the change (a Python-side change cannot be found by swapping _C)."""
    from bisect_tool import locate as locate_mod
    from bisect_tool.matrix import Explanation

    state_dir = request.journal_path.parent  # type: ignore[attr-defined]
    outcome = locate_mod.locate(
        locate_mod.LocateRequest(good, bad, recipe, state_dir,
                                 repo=repo if releases is None else None, releases=releases),
        observer,
    )
    click.echo(locate_mod.render(outcome))
    finding = outcome.finding
    if not finding.decided or finding.explanation is not Explanation.COMPILED:
        raise NoAnswer(
            f"bisect locate says {finding.explanation} ({finding.probability:.1%}): not "
            "bisecting the compiled side (see above)"
        )
    click.echo("")


@cli.command()
@click.option("--good", required=True, help="An end with the good behaviour (ref or release).")
@click.option("--bad", required=True, help="An end with the bad behaviour.")
@click.option(
    "--recipe", "recipe_name", required=True, help="Bundled recipe name or TOML path.",
    shell_complete=complete_recipe,
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
@progress_options
@repo_option
@state_option
@_state_locked()
def locate(
    good: str, bad: str, recipe_name: str, releases: bool, index_url: str | None,
    good_python: Path | None, bad_python: Path | None, lifetimes_per_cell: int,
    confidence: float | None, gpus: str | None, python_exe: str | None, no_controls: bool,
    as_json: bool, quiet: bool, verbose: bool, repo: Path, state_dir: Path | None,
) -> None:
    """Which side carries the change: the probe on {good, bad} Python side x {good, bad}
    compiled side, before any bisect. Exit 0 with an answer, 9 below the asked confidence."""
    from bisect_tool import locate as locate_mod
    from bisect_tool import run
    from bisect_tool.matrix import CELLS, Side

    recipe = recipe_mod.load(recipe_name).override("search", confidence=confidence)
    recipe = recipe.override(
        "runtime", python=python_exe,
        gpus=tuple(g for g in gpus.split(",") if g) if gpus else None,
    )
    if no_controls:
        recipe = recipe.override("probe", controls=False)
    python_dirs = {side: path for side, path in ((Side.GOOD, good_python),
                                                  (Side.BAD, bad_python)) if path is not None}
    request = locate_mod.LocateRequest(
        good, bad, recipe, _state_dir(repo, state_dir, releases=releases),
        repo=None if releases else repo,
        releases=run.ReleaseRequest(index_url=index_url or "") if releases else None,
        python_dirs=python_dirs, lifetimes_per_cell=lifetimes_per_cell,
        command=("bisect", *sys.argv[1:]),
    )
    with _watching(quiet, verbose) as observer:
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
            f"{f.probability:.1%}); raise --lifetimes-per-cell or see the cells above"
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


def _end_leftovers(repo: Path, state_dir: Path, session_id: str) -> int:
    from bisect_tool.run import end_leftovers

    return end_leftovers(repo, state_dir, session_id, _observer())


def _search_overrides(*values: float | int | None) -> dict[str, object]:
    names = ("confidence", "max_evaluations", "cost_new_candidate", "cost_lifetime")
    return {n: v for n, v in zip(names, values, strict=True) if v is not None}


@contextlib.contextmanager
def _watching(quiet: bool, verbose: bool) -> Iterator[Observer]:
    """How a run's progress is shown: a live view on a terminal, plain lines otherwise (or
    with -v), nothing with -q."""
    from bisect_tool.events import ignore
    from bisect_tool.progress import LiveView, PlainLines

    if quiet:
        yield ignore
    elif verbose or not sys.stderr.isatty():
        yield PlainLines(lifetimes=verbose)
    else:
        with LiveView() as view:
            yield view


def _observer() -> Observer:
    from bisect_tool.progress import PlainLines

    return PlainLines(lifetimes=False)


def _print_outcome(outcome: Outcome, journal: Path | None = None) -> None:
    summary = outcome.summary
    if outcome.next_candidate is not None:
        nxt = outcome.next_candidate
        click.echo(f"next: {nxt.sha} {nxt.subject}")
        click.echo("judge it with `bisect good|bad|skip` (it defaults to this commit)")
        return
    if outcome.answered:
        word = "first good" if summary["direction"] == "fix" else "first bad"
        noun = "release" if summary.get("level") == "release" else "commit"
        block = summary["flip_block"]
        if len(block) == 1:
            click.echo(
                f"{word} {noun}: {block[0]} (confidence {summary['confidence']:.1%}, "
                f"{summary['evaluations']} lifetimes)"
            )
        else:
            click.echo(f"{word} {noun} could be any of ({summary['confidence']:.1%}):")
            for sha in block:
                click.echo(f"  {sha}")
        if journal is None:
            click.echo("see `bisect report` for the full report", err=True)
        else:  # replay: the answer is its output, the hint goes with it (issue 32, item 10)
            click.echo(f"the full report: bisect report --journal {shlex.quote(str(journal))}")
    elif outcome.state is not EndState.RUNNING:
        # A scripted caller must tell "found it" from "stopped without an answer".
        raise NoAnswer(
            f"stopped without an answer ({outcome.state}): {outcome.message}; "
            "`bisect report` says what was seen"
        )


@cli.command()
@progress_options
@repo_option
@state_option
@_state_locked(create=False)
def resume(quiet: bool, verbose: bool, repo: Path, state_dir: Path | None) -> None:
    """Continue a bisect from its journal (after a crash or Ctrl-C)."""
    from bisect_tool import run

    with _watching(quiet, verbose) as observer:
        outcome = run.resume(_journal_path(repo, state_dir), observer)
    _print_outcome(outcome)


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@repo_option
@state_option
def status(as_json: bool, repo: Path, state_dir: Path | None) -> None:
    """Where the search stands."""
    from bisect_tool import session

    state = session.replay(journal_mod.read(_journal_path(repo, state_dir)))
    summary = state.summary()
    summary.pop("posterior")
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"state: {_liveness(summary['state'], repo, state_dir)} ({summary['direction']})")
    flip = summary["flip_commit"] or ", ".join(short(str(s)) for s in summary["flip_block"])
    click.echo(f"top candidate: {flip} at {summary['confidence']:.1%}")
    click.echo(f"90% credible set: {len(summary['credible_set'])} commits")
    click.echo(
        f"lifetimes: {summary['evaluations']} over {summary['candidates_tested']} of "
        f"{summary['candidates']} candidates; p ~ {summary['p_estimate']:.2f}"
    )
    tiers = summary.get("tiers")
    if tiers:
        click.echo(
            f"tiers: {tiers['phase']}; the {tiers['kind']} probe ran {tiers['narrow_runs']} "
            f"times and puts the flip at {short(str(tiers['narrow_flip']))} "
            f"({tiers['narrow_confidence']:.1%})"
        )


def _liveness(state: str, repo: Path, state_dir: Path | None) -> str:
    """"running" only while a process holds the state dir; a killed run says it stopped."""
    from bisect_tool import statelock

    if state != "running":
        return state
    path = _state_dir(repo, state_dir)
    contents = journal_mod.read(path / JOURNAL_NAME)
    if contents.header.get("mode", "manual") == "manual":
        return "running (manual: judge the next candidate with `bisect good|bad|skip`)"
    holder = statelock.live_holder(path)
    if holder is not None:
        return f"running ({holder.describe()})"
    return "stopped (no process is running it; `bisect resume` continues it)"


@cli.command()
@repo_option
@state_option
def log(repo: Path, state_dir: Path | None) -> None:
    """The journal, one line per event."""
    contents = journal_mod.read(_journal_path(repo, state_dir))
    h = contents.header
    click.echo(
        f"# session {h['session']}: {h['direction']} {h['good_ref']} (good) {h['bad_ref']} (bad)"
    )
    for e in contents.entries:
        kind = e.get("type")
        if kind == "observation":
            click.echo(
                f"{e['lifetime_id']:<16} {short(e['commit'])} {e['verdict']:<12} "
                + ("[fast probe] " if e.get("tier") == "narrow" else "")
                + f"{e.get('message', '')[:80]}"
            )
        elif kind == "phase":
            click.echo(f"phase            {e['phase']}: {e.get('message', '')}")
        elif kind == "untestable":
            click.echo(f"untestable       {short(e['commit'])} {e.get('message', '')[:80]}")
        elif kind == "controls":
            click.echo(f"controls         {'ok' if e.get('ok') else e.get('problem', '')[:100]}")
        elif kind == "end":
            click.echo(f"end              {e['state']}: {e.get('message', '')}")


@cli.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def replay_cmd(file: Path, as_json: bool) -> None:
    """Rebuild the search from a journal FILE and print where it stands (no repository needed)."""
    from bisect_tool import session

    state = session.replay(journal_mod.read(file))
    summary = state.summary()
    summary.pop("posterior")
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    end = state.end or {}
    if not end:
        click.echo(f"running: top {summary['confidence']:.1%} at {summary['flip_block'][0]}")
        return
    _print_outcome(Outcome(end_state(end["state"]), str(end.get("message", "")), summary),
                   journal=file)


def _manual(verdict: Verdict, ref: str | None, repo: Path, state_dir: Path | None) -> None:
    from bisect_tool import session
    from bisect_tool.designs import bisect as design
    from bisect_tool.range import open_repo, resolve_ref

    path = _journal_path(repo, state_dir)
    state = session.replay(journal_mod.read(path))
    if ref is None:
        nxt = design.next_manual_candidate(state)
        if nxt is None:
            raise UsageError("nothing left to judge; see `bisect status`")
        sha = nxt.sha
    else:
        sha = resolve_ref(open_repo(repo), ref)
    with journal_mod.Journal(path) as journal:
        state.apply(journal.append(design.manual_entry(state, sha, verdict)))
        nxt = design.next_manual_candidate(state)
        if nxt is None:
            # journal the outcome, as the unattended loop does: `status` then says done and a
            # later `start` is not refused as "already in progress"
            state_name, message = design.stop_reason(state) or (
                EndState.NO_CANDIDATE,
                "every candidate that could tell the flip apart is untestable",
            )
            state.apply(journal.append(design.end_entry(state, state_name, message)))
            _print_outcome(Outcome(state_name, message, state.summary()))
            return
    click.echo(f"next: {nxt.sha} {nxt.subject}")


for _name, _verdict, _help in (
    ("good", Verdict.CLEAN, "Mark REF (default: the next candidate) as good in one lifetime."),
    ("bad", Verdict.DIVERGENT, "Mark REF (default: the next candidate) as bad in one lifetime."),
    ("skip", Verdict.UNTESTABLE, "Mark REF (default: the next candidate) as untestable."),
):

    def _make(verdict: Verdict = _verdict) -> Callable[..., None]:
        @_state_locked(create=False)
        def command(ref: str | None, repo: Path, state_dir: Path | None) -> None:
            _manual(verdict, ref, repo, state_dir)

        return command

    cli.command(_name, help=_help)(
        click.argument("ref", required=False)(repo_option(state_option(_make())))
    )


@cli.command()
@repo_option
@state_option
def reset(repo: Path, state_dir: Path | None) -> None:
    """End the bisect: remove its state and any container or process left by a crash.

    Deletes only what bisect wrote: a --state-dir that holds anything else (your files, a git
    work tree) or is a file is refused with exit 13, and nothing is deleted."""
    from bisect_tool import statedir, statelock

    path = state_dir if state_dir is not None else _state_dir(repo, None)
    if not os.path.lexists(path):
        click.echo("no bisect in progress")
        return
    clone = statedir.find_clone(repo)
    # Proven before the lock is taken: taking it writes a lock file into the folder.
    if not statedir.removable(path, clone):
        click.echo(f"no bisect in progress in {path} (it is empty; left as it is)")
        return
    with statelock.hold(path, "reset", notice=_progress):
        entries = statedir.removable(path, clone)  # again: nothing may have come meanwhile
        removed = 0
        session_id = ""
        journal_path = path / JOURNAL_NAME
        if journal_path.exists():
            try:
                session_id = str(journal_mod.read(journal_path).header.get("session", ""))
            except StateError:
                session_id = ""
        ended = _end_leftovers(repo, path, session_id)
        # Only this bisect's leftovers: another bisect may be running on this host (another
        # repo or state dir) and its lifetimes must survive our reset.
        if session_id:
            from bisect_tool.recipe import RuntimeSettings
            from bisect_tool.runtime import make_backend

            for backend_name in ("local", "docker"):
                try:
                    backend = make_backend(
                        RuntimeSettings(backend=backend_name), session="reset",
                        log_dir=path / "logs",
                    )
                    removed += backend.cleanup_stale(session_id)
                except BisectError:
                    continue
        statedir.remove(path, entries)
    click.echo(
        f"removed {path}"
        + (f" and {removed} leftover lifetimes" if removed else "")
        + (f"; ended {ended} leftover probe process group(s)" if ended else "")
    )


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["md", "json"]), default="md")
@click.option("--plot", type=click.Path(path_type=Path), default=None, help="Write the PNG here.")
@click.option("--output", "-o", type=click.Path(path_type=Path), default=None)
@click.option("--journal", "journal_file", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Report this journal file (a bisect's or a locate's) instead of the state "
              "dir's.")
@repo_option
@state_option
def report(
    fmt: str, plot: Path | None, output: Path | None, journal_file: Path | None, repo: Path,
    state_dir: Path | None,
) -> None:
    """The report for the issue tracker (Markdown for GitHub, or JSON with the same content):
    the bisect's, else the locate's of the state dir."""
    from bisect_tool.report import render_report

    path = journal_file or _report_journal(repo, state_dir)
    # the plot is linked from where the report is read: beside -o, else the current folder
    text = render_report(path, fmt, plot, link_from=output.parent if output else Path.cwd())
    if output:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"cannot write the report to {output} ({exc.strerror or exc}); give -o a file "
                "in a folder you can write, or leave -o out to print it"
            ) from None
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)


def _report_journal(repo: Path, state_dir: Path | None) -> Path:
    """The state dir's bisect journal; a dir that holds only a locate's, that one."""
    path = _journal_path(repo, state_dir)
    locate_path = path.with_name("locate.jsonl")  # bisect_tool.locate.LOCATE_JOURNAL
    return locate_path if not path.exists() and locate_path.is_file() else path


def _plan_command() -> click.Command:
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


cli.add_command(_plan_command())
cli.add_command(artifacts_group)
register_commit_prober(probe_commit)
cli.add_command(probe_command)
cli.add_command(demo_command)
cli.add_command(model_group)
cli.add_command(simulate_command)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="bisect", standalone_mode=False)
    except BisectError as exc:
        click.echo(f"bisect: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("bisect: interrupted; `bisect resume` continues where it stopped", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        # One line, like every other error: the bad flag and its allowed range.
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        click.echo(f"bisect: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("bisect: interrupted; `bisect resume` continues where it stopped", err=True)
        sys.exit(130)

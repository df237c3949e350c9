"""What the commands of a session share: where the state dir is, the ``--repo``/``--state-dir``
options, the state dir's lock, how progress is shown, and how a run's outcome is printed."""

from __future__ import annotations

import functools
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path

import click

from bisect_tool.errors import NoAnswer, RangeError, StateDirUnusable
from bisect_tool.journal import JOURNAL_NAME
from bisect_tool.recipes.completion import complete_recipe
from bisect_tool.recipes.recipe import Recipe
from bisect_tool.run.owner import Outcome
from bisect_tool.values import percent, spelled
from bisect_tool.verdict import EndState


def state_dir_of(repo: Path, state_dir: Path | None, *, releases: bool = False) -> Path:
    """Default: inside the target repository's git dir, as git bisect keeps its state. Outside
    a clone, a release-level bisect (which needs none) keeps it in the user state dir, where
    the other commands then find it."""
    if state_dir is not None:
        if state_dir.exists() and not state_dir.is_dir():
            raise StateDirUnusable(
                f"--state-dir {state_dir} is a file, not a folder; pass a folder you can write"
            )
        from bisect_tool.run.statedir import check_location

        check_location(state_dir)  # not among git's own files (issue 38: broken refs)
        return state_dir
    from bisect_tool.run.statedir import STATE_SUBDIR, find_clone

    clone = find_clone(repo)
    if clone is None:
        outside = user_state_dir()
        if releases or (outside / JOURNAL_NAME).exists():
            return outside
        raise RangeError(
            f"{repo} is not a git repository (nor inside one); pass --repo PATH pointing at "
            "your vLLM clone"
        )
    return clone.git_dir / STATE_SUBDIR


def user_state_dir() -> Path:
    """Where a bisect without a clone keeps its journal ($BISECT_STATE_DIR, else the
    platform's user state dir: ~/.local/state/bisect on Linux)."""
    if os.environ.get("BISECT_STATE_DIR"):
        return Path(os.environ["BISECT_STATE_DIR"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_state_dir("bisect", appauthor=False))


def journal_path(repo: Path, state_dir: Path | None) -> Path:
    return state_dir_of(repo, state_dir) / JOURNAL_NAME


def _top_of_clone(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """``--repo`` (default: the current folder) as the top of the clone it lies in, found as
    git finds it: a subdirectory or a linked worktree works like the clone's top. Outside any
    clone the path is kept (a release-level bisect needs none; the others say so)."""
    from bisect_tool.run.statedir import find_clone

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
def _state_dir_given(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> Path | None:
    """``--state-dir`` as a path; an empty one (``--state-dir "$UNSET"``) is refused: it read
    as ``.`` and put the journal, the lock and logs/ into the current folder."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter("is empty (an unset variable?); give a folder, or leave "
                                 "--state-dir out", ctx=ctx, param=param)
    return Path(value)


state_option = click.option(
    "--state-dir",
    type=click.Path(),
    default=None,
    callback=_state_dir_given,
    help="Where the journal and logs live (default: <repo>/.git/bisect-tool).",
)


def ends_options(
    good: str, bad: str, *, recipe_required: bool
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``--good``, ``--bad`` (with their help) and ``--recipe``: the two ends of a question
    and the recipe that says how to ask it (``start``, ``plan``, ``locate``)."""

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        fn = click.option(
            "--recipe", "recipe_name", required=recipe_required, default=None,
            help="Bundled recipe name or TOML path.", shell_complete=complete_recipe,
        )(fn)
        fn = click.option("--bad", required=True, help=bad)(fn)
        return click.option("--good", required=True, help=good)(fn)

    return wrap


def clean_against_option(fn: Callable[..., None]) -> Callable[..., None]:
    """``--clean-against RATE``: the recipe's ``[search] clean_against_rate`` (``start``,
    ``plan``, ``simulate``); None: the recipe's value (0.5 unless it says)."""
    from bisect_tool.clitypes import Finite

    return click.option(
        "--clean-against", "clean_against", type=Finite(0, 1, min_open=True, max_open=True),
        default=None, metavar="RATE",
        help="Before a commit is named, the good end and the commit next to the flip must run "
        "clean often enough that a bug there in RATE of lifetimes or more would have shown "
        "(default 0.5; a rarer one is caught only where it shows, and the answer says so). "
        "It costs ceil(log(1 - 0.995) / log(1 - RATE)) clean lifetimes at the good end at "
        "--confidence 0.99, a few more next to the flip: 8 and 9 at 0.5, 15 and 17 at 0.3, "
        "33 and 37 at 0.15. Set it when the bug may show earlier at a lower rate (a later "
        "commit making it worse). The recipe's [search] clean_against_rate.",
    )(fn)


def gpu_list(gpus: str | None) -> tuple[str, ...] | None:
    """``--gpus 0,1,2``; None when not given (the recipe's stand)."""
    return tuple(g for g in gpus.split(",") if g) if gpus else None


def with_flags(
    recipe: Recipe,
    *,
    no_controls: bool = False,
    no_narrow: bool = False,
    **sections: Mapping[str, object],
) -> Recipe:
    """The recipe with the command line's flags over it: each section's values (None: the
    flag was not given, the recipe's value stands), then --no-controls and --no-narrow."""
    for section, values in sections.items():
        recipe = recipe.override(section, **values)
    if no_controls:
        recipe = recipe.override("probe", controls=False)
    if no_narrow:
        recipe = recipe.override("probe", narrow="")
    return recipe


def progress_options(fn: Callable[..., None]) -> Callable[..., None]:
    fn = click.option("-v", "--verbose", is_flag=True,
                      help="Plain progress lines, one per lifetime too.")(fn)
    return click.option("-q", "--quiet", is_flag=True,
                        help="No progress; only the answer and errors.")(fn)


def notice(message: str) -> None:
    click.echo(message, err=True)


def state_locked(create: bool = True) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Hold the state dir's lock for the whole command (one bisect per state dir; see
    statelock.py). ``create=False``: a command that needs an existing session runs unlocked
    when there is no state dir at all, and says so itself."""

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def command(*args: object, **kwargs: object) -> None:
            from bisect_tool.run import statelock

            path = state_dir_of(
                kwargs["repo"], kwargs["state_dir"],  # type: ignore[arg-type]
                releases=bool(kwargs.get("releases")),
            )
            if kwargs.get("dry_run"):  # `bisect plan` writes nothing, not even the lock
                return fn(*args, **kwargs)
            if not create and not path.is_dir():
                return fn(*args, **kwargs)
            with statelock.hold(path, fn.__name__, notice=notice):
                return fn(*args, **kwargs)

        return command

    return wrap


def run_options(fn: Callable[..., None]) -> Callable[..., None]:
    """What every command that runs lifetimes takes and holds: -q/-v, --repo, --state-dir, and
    the state dir's lock while it runs."""
    return progress_options(repo_option(state_option(state_locked()(fn))))


def print_outcome(outcome: Outcome, journal: Path | None = None) -> None:
    summary = outcome.summary
    if outcome.next_candidate is not None:
        nxt = outcome.next_candidate
        click.echo(f"next: {nxt.sha} {nxt.subject}")
        click.echo("judge it with `bisect good|bad|skip` (it defaults to this commit)")
        return
    if outcome.answered:
        word = "first good" if summary["direction"] == "fix" else "first bad"
        noun = "release" if summary.get("level") == "release" else "commit"
        level = str(summary.get("level") or "commit")
        block = [spelled(str(ref), level) for ref in summary["flip_block"]]
        where = summary.get("flip_provenance") or {}
        if len(block) == 1:
            click.echo(
                f"{word} {noun}: {block[0]} (confidence {percent(summary['confidence'])}, "
                f"{summary['evaluations']} lifetimes)"
            )
            if where.get(summary["flip_block"][0]):
                click.echo(f"  {where[summary['flip_block'][0]]}")
        else:
            click.echo(f"{word} {noun} could be any of ({percent(summary['confidence'])}):")
            for sha, shown in zip(summary["flip_block"], block, strict=True):
                click.echo(f"  {shown}" + (f" ({where[sha]})" if where.get(sha) else ""))
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

"""``bisect status``, ``log``, ``replay`` and ``report``: what a session's journal says, read
without running anything."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click

from bisect_tool import journal as journal_mod
from bisect_tool.cli.common import (
    journal_path,
    print_outcome,
    repo_option,
    state_dir_of,
    state_option,
)
from bisect_tool.errors import UsageError
from bisect_tool.journal import JOURNAL_NAME, entries
from bisect_tool.run.owner import Outcome
from bisect_tool.strategy.tiers import Tier
from bisect_tool.values import percent, rate_text, short, spelled
from bisect_tool.verdict import end_state


@click.command()
@click.option("--json", "as_json", is_flag=True)
@repo_option
@state_option
def status(as_json: bool, repo: Path, state_dir: Path | None) -> None:
    """Where the search stands."""
    from bisect_tool.designs import ledger

    state = ledger.replay(journal_mod.read(journal_path(repo, state_dir)))
    summary = state.standing().status()
    summary.pop("posterior")
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"state: {_liveness(summary['state'], repo, state_dir)} ({summary['direction']})")
    level = str(summary.get("level") or "commit")
    if level == "release":
        flip = ", ".join(spelled(str(s), level) for s in summary["flip_block"])
    else:  # a single commit whole: a script may pass it to git as it is
        flip = summary["flip_commit"] or ", ".join(short(str(s)) for s in summary["flip_block"])
    click.echo(f"top candidate: {flip} at {percent(summary['confidence'])}")
    click.echo(f"90% credible set: {len(summary['credible_set'])} commits")
    click.echo(
        f"lifetimes: {summary['evaluations']} over {summary['candidates_tested']} of "
        f"{summary['candidates']} candidates; p ~ {rate_text(summary['p_estimate'])}"
    )
    tiers = summary.get("tiers")
    if tiers:
        click.echo(
            f"tiers: {tiers['phase']}; the {tiers['kind']} probe ran {tiers['narrow_runs']} "
            f"times and puts the flip at {short(spelled(str(tiers['narrow_flip']), level))} "
            f"({percent(tiers['narrow_confidence'])})"
        )


def _liveness(state: str, repo: Path, state_dir: Path | None) -> str:
    """"running" only while a process holds the state dir; a killed run says it stopped."""
    from bisect_tool.run import statelock

    if state != "running":
        return state
    path = state_dir_of(repo, state_dir)
    contents = journal_mod.read(path / JOURNAL_NAME)
    if contents.header.get("mode", "manual") == "manual":
        return "running (manual: judge the next candidate with `bisect good|bad|skip`)"
    holder = statelock.live_holder(path)
    if holder is not None:
        return f"running ({holder.describe()})"
    return "stopped (no process is running it; `bisect resume` continues it)"


@click.command()
@repo_option
@state_option
def log(repo: Path, state_dir: Path | None) -> None:
    """The journal, one line per event."""
    contents = journal_mod.read(journal_path(repo, state_dir))
    h = contents.header
    level = str(h.get("level") or "commit")
    click.echo(
        f"# session {h['session']}: {h['direction']} {h['good_ref']} (good) {h['bad_ref']} (bad)"
    )
    for entry in contents.entries:
        match entries.parse(entry):
            case entries.Observed() as seen:
                click.echo(
                    f"{seen.lifetime_id:<16} {short(spelled(seen.commit, level))} "
                    f"{seen.verdict:<12} "
                    + ("[fast probe] " if seen.tier is Tier.NARROW else "")
                    + f"{seen.message[:80]}"
                )
            case entries.PhaseChanged(phase=phase, message=message):
                click.echo(f"phase            {phase}: {message}")
            case entries.Refused(commit=commit, message=message):
                click.echo(f"untestable       {short(spelled(commit, level))} {message[:80]}")
            case entries.ControlsRan(ok=ok, problem=problem):
                click.echo(f"controls         {'ok' if ok else problem[:100]}")
            case entries.Ended(state=state, message=message):
                click.echo(f"end              {state}: {message}")
            case _:
                pass


@click.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def replay_cmd(file: Path, as_json: bool) -> None:
    """Rebuild the search from a journal FILE and print where it stands (no repository needed).
    A locate's journal is read as a locate: the explanation its report names."""
    from bisect_tool.designs import ledger

    contents = journal_mod.read(file)
    if contents.header.get("mode") == "locate":
        _replay_locate(contents, file, as_json)
        return
    state = ledger.replay(contents)
    summary = state.standing().status()
    summary.pop("posterior")
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    end = state.end or {}
    if not end:
        top = short(spelled(str(summary["flip_block"][0]), str(summary.get("level") or "commit")))
        click.echo(f"running: top {percent(summary['confidence'])} at {top}")
        return
    from bisect_tool.report.names import commit_entry, rename

    # the candidates as the report spells them (a release's tag, not its stand-in commit's SHA)
    commits = [commit_entry(c, i, "") for i, c in enumerate(contents.header.get("candidates")
                                                             or [])]
    print_outcome(Outcome(end_state(end["state"]), rename(str(end.get("message", "")), commits),
                          summary), journal=file)


def _replay_locate(contents: journal_mod.JournalContents, file: Path, as_json: bool) -> None:
    """A locate's finding from the facts its report is rendered from (issue 41: replay read a
    locate's journal as a bisect's and printed "first bad release: v0.26.0 (100.0 %)" where the
    report said "the compiled side carries the change (99.5 %)")."""
    import shlex

    from bisect_tool.errors import NoAnswer
    from bisect_tool.report import build_locate_report, bundled_recipe

    located = build_locate_report(contents, bundled_recipe(contents))
    f = located["finding"]
    if as_json:
        click.echo(json.dumps({"kind": "locate", **f, "next": located["next"]}, indent=2))
        return
    said = f"{f['words']} ({percent(f['probability'])})"
    click.echo(f"locate {located['bad']} (bad) .. {located['good']} (good): " + (
        said if f["decided"] else f"not decided: {said}, below the {percent(f['stop_at'])} "
        "the run stops at"))
    if f["decided"] and located["next"].get("command"):
        click.echo(f"next: {located['next']['command']}")
    click.echo(f"the full report: bisect report --journal {shlex.quote(str(file))}")
    if not f["decided"]:
        raise NoAnswer(f"the locate stopped undecided ({f['words']} at "
                       f"{percent(f['probability'])})")


@click.command()
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
    _check_outputs(path, journal_file, repo, state_dir, output=output, plot=plot)
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


def _check_outputs(
    journal: Path, journal_file: Path | None, repo: Path, state_dir: Path | None,
    **targets: Path | None,
) -> None:
    """-o and --plot never land on a journal or inside a state dir (``statedir.check_output``):
    the state dir of --repo/--state-dir, and the folder of --journal where it is one."""
    from bisect_tool.errors import BisectError
    from bisect_tool.run import statedir

    homes: list[Path | None] = []
    with contextlib.suppress(BisectError):  # outside a clone, with --journal: none to guard
        homes.append(state_dir_of(repo, state_dir))
    if journal_file is not None and statedir.looks_like_state_dir(journal_file.parent):
        homes.append(journal_file.parent)
    for flag, target in targets.items():
        if target is None:
            continue
        for home in homes or [None]:
            statedir.check_output(target, "-o" if flag == "output" else "--plot", journal, home)


def _report_journal(repo: Path, state_dir: Path | None) -> Path:
    """The state dir's bisect journal; a dir that holds only a locate's, that one."""
    path = journal_path(repo, state_dir)
    locate_path = path.with_name("locate.jsonl")  # bisect_tool.run.locate.LOCATE_JOURNAL
    return locate_path if not path.exists() and locate_path.is_file() else path

"""``bisect good``, ``bad`` and ``skip``: a manual bisect, judged by hand one candidate at a
time (``bisect start`` with neither --recipe nor --run)."""

from __future__ import annotations

from pathlib import Path

import click

from bisect_tool import journal as journal_mod
from bisect_tool.cli.common import (
    journal_path,
    print_outcome,
    repo_option,
    state_locked,
    state_option,
)
from bisect_tool.errors import UsageError
from bisect_tool.run.owner import Outcome
from bisect_tool.values import Verdict
from bisect_tool.verdict import EndState


def _manual(verdict: Verdict, ref: str | None, repo: Path, state_dir: Path | None) -> None:
    from bisect_tool.designs import ledger, manual
    from bisect_tool.designs.bisect import end_entry
    from bisect_tool.designs.phases import stop_reason
    from bisect_tool.range import open_repo, resolve_ref

    path = journal_path(repo, state_dir)
    state = ledger.replay(journal_mod.read(path))
    if ref is None:
        nxt = manual.next_manual_candidate(state)
        if nxt is None:
            raise UsageError("nothing left to judge; see `bisect status`")
        sha = nxt.sha
    else:
        sha = resolve_ref(open_repo(repo), ref)
    with journal_mod.Journal(path) as journal:
        state.apply(journal.append(manual.manual_entry(state, sha, verdict)))
        nxt = manual.next_manual_candidate(state)
        if nxt is None:
            # journal the outcome, as the unattended loop does: `status` then says done and a
            # later `start` is not refused as "already in progress"
            state_name, message = stop_reason(state) or (
                EndState.NO_CANDIDATE,
                "every candidate that could tell the flip apart is untestable",
            )
            state.apply(journal.append(end_entry(state, state_name, message)))
            print_outcome(Outcome(state_name, message, state.standing().status()))
            return
    click.echo(f"next: {nxt.sha} {nxt.subject}")
    why = manual.why_again(state, nxt)
    if why:
        click.echo(why)


def _judging(name: str, verdict: Verdict, help: str) -> click.Command:
    @state_locked(create=False)
    def command(ref: str | None, repo: Path, state_dir: Path | None) -> None:
        _manual(verdict, ref, repo, state_dir)

    return click.command(name, help=help)(
        click.argument("ref", required=False)(repo_option(state_option(command)))
    )


judge_commands = [
    _judging(
        "good", Verdict.CLEAN, "Mark REF (default: the next candidate) as good in one lifetime."
    ),
    _judging(
        "bad", Verdict.DIVERGENT, "Mark REF (default: the next candidate) as bad in one lifetime."
    ),
    _judging("skip", Verdict.UNTESTABLE, "Mark REF (default: the next candidate) as untestable."),
]

"""``bisect reset``: end a bisect, removing its state dir (only what bisect wrote there) and
whatever a crashed run left running."""

from __future__ import annotations

import os
from pathlib import Path

import click

from bisect_tool import journal as journal_mod
from bisect_tool.cli.common import notice, repo_option, state_dir_of, state_option
from bisect_tool.errors import BisectError, StateError
from bisect_tool.journal import JOURNAL_NAME


@click.command()
@repo_option
@state_option
def reset(repo: Path, state_dir: Path | None) -> None:
    """End the bisect: remove its state and any container or process left by a crash.

    Deletes only what bisect wrote: a --state-dir that holds anything else (your files, a git
    work tree) or is a file is refused with exit 13, and nothing is deleted."""
    from bisect_tool.run import statedir, statelock

    path = state_dir if state_dir is not None else state_dir_of(repo, None)
    if not os.path.lexists(path):
        click.echo("no bisect in progress")
        return
    clone = statedir.find_clone(repo)
    # Proven before the lock is taken: taking it writes a lock file into the folder.
    if not statedir.removable(path, clone):
        click.echo(f"no bisect in progress in {path} (it is empty; left as it is)")
        return
    with statelock.hold(path, "reset", notice=notice):
        entries = statedir.removable(path, clone)  # again: nothing may have come meanwhile
        removed = 0
        session_id = ""
        journal_path = path / JOURNAL_NAME
        if journal_path.exists():
            try:
                session_id = str(journal_mod.read(journal_path).header.get("session", ""))
            except StateError:
                session_id = ""
        # A copy (`cp -a`) of a live state dir names the live run's probes and session: they
        # are not this folder's to end (issue 38: reset of a copy killed the live run's probe).
        copy = statedir.copied_from(path)
        if copy:
            session_id = ""
            notice(f"{path} is a copy of another state dir (its mark names another folder): "
                   "the processes it records are that one's, and are left running")
        ended = 0 if copy else _end_leftovers(repo, path, session_id)
        # Only this bisect's leftovers: another bisect may be running on this host (another
        # repo or state dir) and its lifetimes must survive our reset.
        if session_id:
            from bisect_tool.recipes.recipe import RuntimeSettings
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



def _end_leftovers(repo: Path, state_dir: Path, session_id: str) -> int:
    from bisect_tool.run.owner import end_leftovers
    from bisect_tool.run.progress import PlainLines

    return end_leftovers(repo, state_dir, session_id, PlainLines(lifetimes=False))

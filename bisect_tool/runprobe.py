"""What a ``--run`` command's exit says about the command itself, not about the commit.

``git bisect run`` counts 1..127 (but 125) as bad, and so does this tool; but 126 (found, not
executable) and 127 (not found) almost always mean the command never ran: most often a relative
path such as ``bash ../probe.sh``, which resolves against the candidate's temporary worktree, not
the directory the user typed it in. Counted as bad, every commit is "bad" and the search names a
first bad commit with high confidence. So these abort, with one line naming the path as the
worktree sees it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

NOT_EXECUTABLE = 126
NOT_FOUND = 127

# bash: "bash: line 1: ./probe.sh: No such file or directory", "bash: ../p.sh: Permission
# denied", "bash: line 1: nope: command not found"; env/exec: "env: 'x': No such file..."
_SHELL_ERROR = re.compile(
    r"^(?:[^:\n]*: )?(?:line \d+: )?(?:exec: )?['`]?(?P<path>[^:'`\n]+?)['`]?: "
    r"(?P<why>No such file or directory|command not found|Permission denied|Is a directory"
    r"|cannot execute[^\n]*|not found)\s*$",
    re.MULTILINE,
)


def banner(cwd: Path, commit: str) -> str:
    """The first line of the first lifetime's log: where relative paths resolve."""
    return (
        f"bisect: --run runs in {cwd} (a temporary worktree of {commit[:12]}, not your "
        "checkout); relative paths in the command resolve from there"
    )


def exit_problem(code: int, output: str, command: str, cwd: Path, commit: str) -> str | None:
    """The abort message for an exit that says the command could not run, else None."""
    if code not in (NOT_EXECUTABLE, NOT_FOUND):
        return None
    matches = list(_SHELL_ERROR.finditer(output))
    named = matches[-1].group("path").strip() if matches else _first_word(command)
    why = matches[-1].group("why") if matches else ""
    what = "not executable" if code == NOT_EXECUTABLE else "not found"
    head = f"--run command exited {code} ({what}) at {commit[:12]}"
    if "/" not in named and why in ("command not found", "not found", ""):
        return (
            f"{head}: `{named}` is not a command on PATH; fix the command (exit 126/127 "
            "means it never ran, so it is not counted as bad)"
        )
    seen = (cwd / named).resolve() if not Path(named).is_absolute() else Path(named)
    fix = (
        "make it executable (chmod +x) or run it through its interpreter"
        if code == NOT_EXECUTABLE and seen.exists()
        else "give an absolute path"
    )
    return (
        f"{head}: `{named}` is {seen} as the candidate's worktree sees it"
        f"{'' if seen.exists() else ', which does not exist'} (the command runs in a temporary "
        f"worktree of each commit, not in your checkout); {fix}"
    )


def _first_word(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    # "bash ../probe.sh" / "python3 x.py": the script is what goes missing, not the interpreter
    for word in words:
        if "/" in word:
            return word
    return words[0] if words else command

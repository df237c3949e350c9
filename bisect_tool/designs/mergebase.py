"""The older end's stand-in: where the ends are not on one line of history (vLLM's release
tags, each on a branch of its own), ``git bisect`` tests their merge base first, and the range
(``bisect_tool.range``) puts it where the older end would be. When it does not behave as that
end does, no commit between it and the newer end can be named: git stops and says "the merge
base is bad" (a regression search) or "the merge base is new" (a search for the fix). So does
the bisect, in one line that says which branch changed instead, and the command that bisects
it (the run's own command, with the ends swapped for the merge base and the older end). Pure.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.range import Candidate
from bisect_tool.values import Direction

_REF_FLAGS = ("--good", "--bad")


def with_ends(command: Sequence[str], good: str, bad: str) -> list[str]:
    """``command`` (``bisect start ...`` as the user typed it) with its ``--good``/``--bad``
    values replaced (``--good X`` and ``--good=X`` alike); the ends are appended if absent."""
    ends = {"--good": good, "--bad": bad}
    out: list[str] = []
    seen: set[str] = set()
    skip = False
    for i, arg in enumerate(command):
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in _REF_FLAGS:
            seen.add(flag)
            out += [flag, ends[flag]]
            skip = "=" not in arg and i + 1 < len(command)
            continue
        out.append(arg)
    for flag in _REF_FLAGS:
        if flag not in seen:
            out += [flag, ends[flag]]
    return out


def merge_base_message(header: Mapping[str, Any], base: Candidate, direction: Direction,
                       seen: str) -> str:
    """One line for a merge base that did not behave as the older end it stands for: what git
    says, where the change must be instead, and the bisect that finds it. ``seen`` says what
    its runs showed ("2 of 2 lifetimes divergent")."""
    older = base.stands_for
    newer = str(header.get("bad_ref") if direction is Direction.REGRESSION
                else header.get("good_ref"))
    mainline = str(header.get("mainline") or "main").removeprefix("refs/heads/")
    mainline = mainline.removeprefix("refs/remotes/")
    command = [str(c) for c in header.get("command") or []]
    if direction is Direction.REGRESSION:
        # the older end is good; its merge base with the bad end shows the bug
        git_says, what = "bad", (
            f"the bug is older than where {older}'s branch left {mainline}, and a commit on "
            f"{older}'s branch fixed it (no commit between {base.label} and {newer} brought "
            "it)")
        good, bad = older, base.sha
        ask = f"find that fix with `{_start(command, good, bad)}`, or give an older --good"
    else:
        # the older end is bad; its merge base with the good end does not show the bug
        git_says, what = "new", (
            f"the bug came in on {older}'s branch after it left {mainline} at {base.label} "
            f"(no commit between {base.label} and {newer} fixed it)")
        good, bad = base.sha, older
        ask = (f"find what brought it with `{_start(command, good, bad)}`, or check that the "
               f"probe shows the bug at {older}")
    shown = "shows" if direction is Direction.REGRESSION else "does not show"
    return (f"the merge base {base.label} of {older} and {newer}, which git tests first in "
            f"{older}'s place, {shown} the bug ({seen}): git says \"the merge base is "
            f"{git_says}\": {what}; {ask}")


def _start(command: Sequence[str], good: str, bad: str) -> str:
    if len(command) >= 2 and command[0] == "bisect" and command[1] == "start":
        return shlex.join(with_ends(command, good, bad))
    return shlex.join(["bisect", "start", "--good", good, "--bad", bad])

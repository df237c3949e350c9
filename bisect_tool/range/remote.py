"""Where the report's commit links point: the clone's own GitHub remote, or nowhere.

A link to vllm-project/vllm for a commit of some other repository (a fork with private commits,
an unrelated project under ``--run``) is a confident wrong link, so the base is taken from the
clone's remote at ``start`` (recorded in the journal header, as the report is built from the
journal alone) and links are left out when that remote is not a GitHub vLLM repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_GITHUB = re.compile(
    r"^(?:https?://(?:[^@/]+@)?github\.com/|git@github\.com:|ssh://git@github\.com/)"
    r"(?P<owner>[A-Za-z0-9_.-]+)/(?P<name>[A-Za-z0-9_.-]+?)(?:\.git)?/?$"
)


def link_base(url: str) -> str:
    """``https://github.com/OWNER/vllm`` for a GitHub remote of a vLLM repository, else ''."""
    m = _GITHUB.match(url.strip())
    if not m or m.group("name").lower() != "vllm":
        return ""
    return f"https://github.com/{m.group('owner')}/{m.group('name')}"


def clone_link_base(repo: Path) -> str:
    """The link base of ``repo``'s remote (``origin``, else the first one), or ''."""
    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    remotes = git("remote").split()
    if not remotes:
        return ""
    name = "origin" if "origin" in remotes else remotes[0]
    return link_base(git("remote", "get-url", name))

"""bisect: find the vLLM commit that introduced or fixed an intermittent kernel bug."""

from __future__ import annotations

import re
from pathlib import Path

_SOURCE = Path(__file__).resolve().parent.parent  # the checkout, when run from a source tree
_VERSION_LINE = re.compile(r'^version\s*=\s*"([^"]+)"', re.MULTILINE)


def __getattr__(name: str) -> str:
    # Looked up when asked, not on import: importlib.metadata costs ~30 ms at every start, in
    # the window where a Ctrl-C could not yet be turned into one line (__main__.py).
    if name != "__version__":
        raise AttributeError(f"module 'bisect_tool' has no attribute {name!r}")
    return tool_version()


def tool_version() -> str:
    """The version a journal and a report name (issue 32: "0+unknown" told a reader nothing).

    pyproject.toml is the one place the version is written: pip's metadata of it when the tool
    is installed, else pyproject.toml itself (a source tree on ``PYTHONPATH``, as on the lent
    GPU machine). Where the code is a git checkout, the commit is added as a local version
    label (``0.1.0+g9593ce3``): an editable install says 0.1.0 for every commit."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        base = version("bisect-tool")
    except PackageNotFoundError:
        base = _pyproject_version() or "0+unknown"
    commit = git_commit(_SOURCE)
    return f"{base}+g{commit[:7]}" if commit and "+" not in base else base


def _pyproject_version() -> str:
    try:
        text = (_SOURCE / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return ""
    found = _VERSION_LINE.search(text)
    return found.group(1) if found else ""


def git_commit(root: Path) -> str:
    """The commit checked out at ``root`` (a clone or a linked worktree), read from git's files
    (no git process at every start); "" when ``root`` is no checkout or the ref is unreadable."""
    try:
        dot = root / ".git"
        if dot.is_file():  # a linked worktree: "gitdir: <main>/.git/worktrees/<name>"
            gitdir = Path(dot.read_text(encoding="utf-8").split(":", 1)[1].strip())
            gitdir = gitdir if gitdir.is_absolute() else (root / gitdir).resolve()
        elif dot.is_dir():
            gitdir = dot
        else:
            return ""
        head = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
        if not head.startswith("ref:"):
            return head if re.fullmatch(r"[0-9a-f]{40}", head) else ""
        ref = head.split(":", 1)[1].strip()
        common = gitdir
        if (gitdir / "commondir").is_file():
            common = (gitdir / (gitdir / "commondir").read_text(encoding="utf-8").strip())
        for base in (gitdir, common):
            loose = base / ref
            if loose.is_file():
                return loose.read_text(encoding="utf-8").strip()
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(encoding="utf-8").splitlines():
                sha, _, name = line.partition(" ")
                if name == ref:
                    return sha
    except (OSError, IndexError, UnicodeDecodeError):
        return ""
    return ""

"""The commit range: resolve --good/--bad in the target repository, find the direction, list
the first-parent candidates (a merge is blamed as a unit, as ``git bisect --first-parent``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool.errors import RangeError
from bisect_tool.values import Direction

_PR = re.compile(r"\(#(\d+)\)")
_HEX = re.compile(r"^[0-9a-f]{12,40}$")


@dataclass(frozen=True)
class Candidate:
    sha: str
    subject: str
    pr: int | None = None
    tags: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """How messages name it: a commit by its 12-hex prefix, a release by its id."""
        return self.sha[:12] if _HEX.match(self.sha) else self.sha

    def to_dict(self) -> dict[str, object]:
        return {"sha": self.sha, "subject": self.subject, "pr": self.pr, "tags": list(self.tags)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Candidate:
        pr = data.get("pr")
        tags = data.get("tags") or []
        return cls(
            str(data["sha"]),
            str(data.get("subject", "")),
            int(pr) if isinstance(pr, int) else None,
            tuple(str(t) for t in tags) if isinstance(tags, list) else (),
        )


@dataclass(frozen=True)
class CommitRange:
    good_ref: str
    bad_ref: str
    good: str
    bad: str
    direction: Direction
    candidates: tuple[Candidate, ...]  # old end first, new end last; both ends included
    paths: tuple[str, ...] = ()

    @property
    def old_end(self) -> Candidate:
        return self.candidates[0]

    @property
    def new_end(self) -> Candidate:
        return self.candidates[-1]

    def position(self, sha: str) -> int:
        for i, c in enumerate(self.candidates):
            if c.sha == sha:
                return i
        raise RangeError(f"commit {sha[:12]} is not a candidate of this range")


def pr_number(subject: str) -> int | None:
    found = _PR.findall(subject)
    return int(found[-1]) if found else None


def open_repo(path: Path) -> Any:
    import git  # gitpython: imported here so the GPU-side commands work without it

    try:
        return git.Repo(path, search_parent_directories=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise RangeError(
            f"{path} is not a git repository; pass --repo PATH pointing at your vLLM clone"
        ) from None


def remote_url(path: Path) -> str:
    """The clone's ``origin`` URL (or its first remote's), "" when it has none: the report links
    commits only for a clone of the vLLM repository on GitHub."""
    try:
        repo = open_repo(path)
    except RangeError:
        return ""
    with repo:
        remotes = list(repo.remotes)
        chosen = next((r for r in remotes if r.name == "origin"), remotes[0] if remotes else None)
        if chosen is None:
            return ""
        try:
            return str(next(iter(chosen.urls), ""))
        except Exception:  # a remote without a URL (gitpython raises its own error types)
            return ""


def resolve_ref(repo: Any, ref: str) -> str:
    """A full SHA for a tag, branch, or short/full SHA; unknown refs suggest near names."""
    import git

    try:
        return str(repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}"))
    except git.GitCommandError:
        names = [t.name for t in repo.tags] + [h.name for h in repo.heads]
        close = difflib.get_close_matches(ref, names, n=3, cutoff=0.5)
        if not close and names:
            close = [n for n in names if n.startswith(ref)][:3]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise RangeError(f"unknown ref '{ref}'{hint}") from None


def _is_ancestor(repo: Any, a: str, b: str) -> bool:
    import git

    try:
        repo.git.merge_base("--is-ancestor", a, b)
        return True
    except git.GitCommandError:
        return False


def resolve_range(
    repo_path: Path, good_ref: str, bad_ref: str, paths: Sequence[str] = ()
) -> CommitRange:
    repo = open_repo(repo_path)
    good = resolve_ref(repo, good_ref)
    bad = resolve_ref(repo, bad_ref)
    if good == bad:
        raise RangeError(f"--good {good_ref} and --bad {bad_ref} are the same commit {good[:12]}")
    if _is_ancestor(repo, good, bad):
        direction, old, new = Direction.REGRESSION, good, bad
    elif _is_ancestor(repo, bad, good):
        direction, old, new = Direction.FIX, bad, good
    else:
        raise RangeError(
            f"neither {good_ref} nor {bad_ref} is an ancestor of the other; pick two commits on "
            "one line of history (e.g. tags on main)"
        )
    tags_by_sha: dict[str, list[str]] = {}
    for tag in repo.tags:
        try:
            tags_by_sha.setdefault(tag.commit.hexsha, []).append(tag.name)
        except ValueError:
            continue
    # One git call: each first-parent commit with the files it changed against its first parent
    # (-m --first-parent shows a merge's whole change, so a merge is blamed as a unit).
    log = repo.git.log(
        "--first-parent", "-m", "--name-only", "--format=%x00%H%x01%s", f"{old}..{new}"
    )
    changed: list[tuple[str, str, list[str]]] = []
    for chunk in log.split("\x00")[1:]:
        head, _, files = chunk.partition("\n")
        sha, _, subject = head.partition("\x01")
        changed.append((sha, subject, [f for f in files.splitlines() if f.strip()]))
    changed.reverse()  # oldest first
    if not changed:
        raise RangeError(f"the range {old[:12]}..{new[:12]} is empty")
    first_parent = {sha for sha, _, _ in changed}
    if new not in first_parent:
        raise RangeError("the newer end is not on its own first-parent history")

    def touches(files: list[str]) -> bool:
        return any(
            f == p.rstrip("/") or f.startswith(p.rstrip("/") + "/") for f in files for p in paths
        )

    old_subject = repo.commit(old).summary
    candidates = [
        Candidate(
            old, str(old_subject), pr_number(str(old_subject)), tuple(tags_by_sha.get(old, []))
        )
    ]
    for sha, subject, files in changed:
        if sha != new and paths and not touches(files):
            continue
        candidates.append(
            Candidate(sha, subject, pr_number(subject), tuple(tags_by_sha.get(sha, [])))
        )
    if paths and len(candidates) == 2 and not touches(changed[-1][2]):
        raise RangeError(
            f"no commit between {old[:12]} and {new[:12]} touches {', '.join(paths)}: the "
            "compiled files are the same at both ends; drop the path filter or widen the range"
        )
    return CommitRange(good_ref, bad_ref, good, bad, direction, tuple(candidates), tuple(paths))

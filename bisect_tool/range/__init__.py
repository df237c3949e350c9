"""The commit range: resolve --good/--bad in the target repository, find the direction, list
the first-parent candidates (a merge is blamed as a unit, as ``git bisect --first-parent``).

vLLM's releases are not on one line of history (its RELEASE.md): each is built from a release
branch cut from ``main`` a day or two before the release, with an RC tag, a version bump and
cherry-picked fixes that main never gets back, so ``git merge-base --is-ancestor v0.26.0
v0.27.0`` is false in every real clone (a release commit can be "not from any branch", vLLM
#25476). Where neither end is an ancestor of the other, the candidates are what ``git bisect``
tests: the commits reachable from the newer end and not from the older one, and their merge
base, which git tests first, stands in for the older end. For release tags that merge base is
where the older release's branch left main, so the candidates are main's first-parent commits
between the two branch points, then the newer release's own branch (its *tail*: the bump, the
RC, the cherry-picks). The main line is ``--mainline`` (default: the remote's main, else
``main``); commits not on it are marked with the branch they live on, and a cherry-pick with the
main commit it copies (its ``(cherry picked from commit X)`` trailer, else its patch id).
"""

from __future__ import annotations

import difflib
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool.errors import RangeError
from bisect_tool.values import Direction

_PR = re.compile(r"\(#(\d+)\)")
_HEX = re.compile(r"^[0-9a-f]{12,40}$")
_PICKED = re.compile(r"\(cherry picked from commit ([0-9a-f]{7,40})\)")
#: where the main line is looked for when --mainline is not given, in order
DEFAULT_MAINLINES = ("refs/remotes/origin/HEAD", "refs/remotes/origin/main", "refs/heads/main",
                     "refs/heads/master")
#: how many main commits after a branch point a cherry-pick's original is looked for by patch id
#: when its subject names none (a bound: `git patch-id` reads every one of their diffs)
PATCH_ID_WINDOW = 3000


@dataclass(frozen=True)
class Candidate:
    sha: str
    subject: str
    pr: int | None = None
    tags: tuple[str, ...] = ()
    #: "" on the main line; else the branch that holds it ("releases/v0.27.0", or "the branch of
    #: v0.27.0" where no branch ref does): vLLM publishes per-commit wheels for main's commits
    #: only (#16217)
    branch: str = ""
    #: a commit of a release branch that copies a main commit: that commit's full SHA
    picked_from: str = ""
    #: the older end as given ("v0.26.0") when this commit, their merge base, stands in for it
    stands_for: str = ""
    #: committer time (seconds since the epoch); 0 when unknown (a release, an old journal)
    time: int = 0

    @property
    def label(self) -> str:
        """How messages name it: a commit by its 12-hex prefix, a release by its id."""
        return self.sha[:12] if _HEX.match(self.sha) else self.sha

    @property
    def on_mainline(self) -> bool:
        return not self.branch

    def provenance(self) -> str:
        """Where a commit off the main line lives and which main commit it copies ("" for a
        commit of the main line): "on releases/v0.27.0, the cherry-pick of da42667c3b1e"."""
        if not self.branch:
            return ""
        where = f"on {self.branch}, not on the main line"
        if self.picked_from:
            where += f"; the cherry-pick of {self.picked_from[:12]}"
        return where

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"sha": self.sha, "subject": self.subject, "pr": self.pr,
                                  "tags": list(self.tags)}
        # only what is set: journals of a history on one line read as they did
        for key in ("branch", "picked_from", "stands_for", "time"):
            value = getattr(self, key)
            if value:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Candidate:
        pr = data.get("pr")
        tags = data.get("tags") or []
        when = data.get("time")
        return cls(
            str(data["sha"]),
            str(data.get("subject", "")),
            int(pr) if isinstance(pr, int) else None,
            tuple(str(t) for t in tags) if isinstance(tags, list) else (),
            branch=str(data.get("branch") or ""),
            picked_from=str(data.get("picked_from") or ""),
            stands_for=str(data.get("stands_for") or ""),
            time=int(when) if isinstance(when, int) else 0,
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
    #: the main line the range was placed on ("refs/remotes/origin/main"); "" when none resolved
    mainline: str = ""
    #: commits the path filter left out, by why (``{"touch none of csrc/, ...": 212}``)
    left_out: tuple[tuple[str, int], ...] = ()

    @property
    def old_end(self) -> Candidate:
        return self.candidates[0]

    @property
    def new_end(self) -> Candidate:
        return self.candidates[-1]

    @property
    def merge_base(self) -> str:
        """The older end's stand-in (git tests the merge base first), "" when the ends are on
        one line of history."""
        return self.old_end.sha if self.old_end.stands_for else ""

    @property
    def tail(self) -> tuple[Candidate, ...]:
        """The candidates that live only on a branch (a release's bump, RC and cherry-picks)."""
        return tuple(c for c in self.candidates if c.branch)

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
        names = ([t.name for t in repo.tags] + [h.name for h in repo.heads]
                 + [r.name for r in repo.refs if r.path.startswith("refs/remotes/")])
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


def _merge_base(repo: Any, a: str, b: str) -> str:
    import git

    try:
        return str(repo.git.merge_base(a, b)).split()[0]
    except (git.GitCommandError, IndexError):
        return ""


def resolve_mainline(repo: Any, mainline: str | None) -> str:
    """The full name of the ref taken as the main line: ``mainline`` as given (an unknown one is
    an error), else the first of ``DEFAULT_MAINLINES`` the clone has; "" when it has none."""
    import git

    if mainline:
        try:
            resolve_ref(repo, mainline)
        except RangeError as exc:
            raise RangeError(f"--mainline: {exc}") from None
        try:
            full = str(repo.git.rev_parse("--symbolic-full-name", mainline)).strip()
        except git.GitCommandError:
            full = ""
        return full or mainline
    for ref in DEFAULT_MAINLINES:
        try:
            repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}")
        except git.GitCommandError:
            continue
        if ref.endswith("/HEAD"):  # origin/HEAD names the remote's default branch
            try:
                return str(repo.git.symbolic_ref(ref)).strip()
            except git.GitCommandError:
                pass
        return ref
    return ""


def _short_ref(ref: str) -> str:
    for prefix in ("refs/heads/", "refs/remotes/", "refs/tags/"):
        if ref.startswith(prefix):
            return ref[len(prefix):]
    return ref


def _older_end(repo: Any, good: str, bad: str, mainline: str,
               good_ref: str, bad_ref: str) -> str:
    """Of two ends neither of which is an ancestor of the other, the older one: the one whose
    branch left the main line first (vLLM's releases), else the one committed first."""
    if mainline:
        fork_g, fork_b = _merge_base(repo, good, mainline), _merge_base(repo, bad, mainline)
        if fork_g and fork_b and fork_g != fork_b:
            if _is_ancestor(repo, fork_b, fork_g):
                return bad
            if _is_ancestor(repo, fork_g, fork_b):
                return good
    when_g, when_b = repo.commit(good).committed_date, repo.commit(bad).committed_date
    if when_g == when_b:
        raise RangeError(
            f"cannot tell which of {good_ref} and {bad_ref} is older: they left "
            f"{_short_ref(mainline) or 'the main line'} at the same commit, at the same time; "
            "give --mainline REF, or two commits on one line of history"
        )
    return good if when_g < when_b else bad


def _git_lines(repo_path: Path, *args: str, data: str | None = None) -> list[str]:
    """A git command's output lines (for the plumbing gitpython has no call for)."""
    proc = subprocess.run(["git", "-C", str(repo_path), *args], input=data, text=True,
                          capture_output=True, check=False)
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def _patch_ids(repo_path: Path, *log_args: str) -> dict[str, str]:
    """patch id -> commit, for the commits ``git log log_args`` lists (stable ids: a
    cherry-pick that applied cleanly has its original's)."""
    diffs = subprocess.run(["git", "-C", str(repo_path), "log", "-p", "--no-color",
                            "--format=commit %H", *log_args],
                           capture_output=True, text=True, check=False).stdout
    out: dict[str, str] = {}
    for line in _git_lines(repo_path, "patch-id", "--stable", data=diffs):
        pid, _, sha = line.partition(" ")
        out.setdefault(pid, sha)
    return out


def _originals(repo_path: Path, repo: Any, tail: Sequence[str], fork: str,
               mainline: str) -> dict[str, str]:
    """For each commit of a release branch's tail that copies a main commit: that commit. The
    ``(cherry picked from commit X)`` trailer (``git cherry-pick -x``) when it names a commit of
    this clone, else the main commit after the branch point with the same patch id (looked for
    first among those with the same subject, then among the next ``PATCH_ID_WINDOW``)."""
    found: dict[str, str] = {}
    unnamed: list[str] = []
    for sha in tail:
        trailer = _PICKED.findall(str(repo.commit(sha).message))
        if trailer:
            try:
                found[sha] = str(repo.git.rev_parse("--verify", "--quiet",
                                                    f"{trailer[-1]}^{{commit}}"))
                continue
            except Exception:  # the original is not in this clone: the patch id may still say
                pass
        unnamed.append(sha)
    if not unnamed or not mainline:
        return found
    after = f"{fork}..{mainline}" if fork else mainline
    subjects: dict[str, list[str]] = {}
    for line in _git_lines(repo_path, "log", "--first-parent", "--format=%H%x01%s",
                           f"--max-count={PATCH_ID_WINDOW}", after):
        sha, _, subject = line.partition("\x01")
        subjects.setdefault(subject, []).append(sha)
    for sha in unnamed:
        own = _patch_ids(repo_path, "-1", sha)
        if not own:
            continue  # an empty commit (a bump with no diff) copies nothing
        (pid,) = own
        same_subject = subjects.get(str(repo.commit(sha).summary), [])
        pool = _patch_ids(repo_path, "--no-walk", *same_subject) if same_subject else {}
        if pid not in pool:
            pool = _patch_ids(repo_path, "--first-parent", f"--max-count={PATCH_ID_WINDOW}",
                              after)
        if pid in pool:
            found[sha] = pool[pid]
    return found


def _branch_holding(repo_path: Path, commit: str, mainline: str, ref: str) -> str:
    """The name of a branch that holds ``commit`` (a release branch first), else "the branch
    of REF"."""
    names = [n for n in _git_lines(repo_path, "for-each-ref", f"--contains={commit}",
                                   "--format=%(refname)", "refs/heads", "refs/remotes")
             if n != mainline and not n.endswith("/HEAD")]
    names.sort(key=lambda n: ("release" not in n, n.startswith("refs/remotes/"), n))
    return _short_ref(names[0]) if names else f"the branch of {ref}"


def resolve_range(
    repo_path: Path,
    good_ref: str,
    bad_ref: str,
    paths: Sequence[str] = (),
    mainline: str | None = None,
) -> CommitRange:
    repo = open_repo(repo_path)
    good = resolve_ref(repo, good_ref)
    bad = resolve_ref(repo, bad_ref)
    if good == bad:
        raise RangeError(f"--good {good_ref} and --bad {bad_ref} are the same commit {good[:12]}")
    main_ref = resolve_mainline(repo, mainline)
    direction, base, new, stands_for = _ends(repo, good, bad, main_ref, good_ref, bad_ref)
    tags_by_sha = _tags_by_sha(repo)
    changed = _first_parent_changes(repo, base, new)
    parent = str(repo.git.rev_parse(f"{changed[0][0]}^1")) if changed else ""
    if parent != base:
        raise RangeError(
            f"{base[:12]}, the merge base of {good_ref} and {bad_ref}, is not on "
            f"{(bad_ref if new == bad else good_ref)}'s first-parent history: give two commits "
            "on one line of history, or the release tags themselves"
        )
    off_main: set[str] = set()
    if main_ref:
        off_main = set(_git_lines(repo_path, "rev-list", new, "--not", main_ref))
    new_ref = bad_ref if new == bad else good_ref
    branch = _branch_holding(repo_path, new, main_ref, new_ref) if off_main else ""
    fork = _merge_base(repo, new, main_ref) if main_ref and off_main else ""
    picked = _originals(repo_path, repo, [c[0] for c in changed if c[0] in off_main], fork,
                        main_ref) if off_main else {}

    def touches(files: list[str]) -> bool:
        return any(
            f == p.rstrip("/") or f.startswith(p.rstrip("/") + "/") for f in files for p in paths
        )

    def candidate(sha: str, when: int, subject: str, **more: str) -> Candidate:
        return Candidate(sha, subject, pr_number(subject), tuple(tags_by_sha.get(sha, [])),
                         branch=branch if sha in off_main else "",
                         picked_from=picked.get(sha, ""), time=when, **more)

    base_commit = repo.commit(base)
    candidates = [candidate(base, int(base_commit.committed_date), str(base_commit.summary),
                            stands_for=stands_for)]
    left_out = 0
    for sha, when, subject, files in changed:
        if sha != new and paths and not touches(files):
            left_out += 1
            continue
        candidates.append(candidate(sha, when, subject))
    if paths and len(candidates) == 2 and not touches(changed[-1][3]):
        raise RangeError(
            f"no commit between {base[:12]} and {new[:12]} touches {', '.join(paths)}: the "
            "compiled files are the same at both ends; drop the path filter or widen the range"
        )
    why = (((f"touch none of {', '.join(paths)}", left_out),) if left_out else ())
    return CommitRange(good_ref, bad_ref, good, bad, direction, tuple(candidates), tuple(paths),
                       mainline=main_ref, left_out=why)



def _ends(
    repo: Any, good: str, bad: str, main_ref: str, good_ref: str, bad_ref: str
) -> tuple[Direction, str, str, str]:
    """(direction, the range's base, its new end, the ref the base stands in for): the base is
    the older end, or where the ends are not on one line of history their merge base, which
    stands in for the older end ("" where it is that end)."""
    if _is_ancestor(repo, good, bad):
        return Direction.REGRESSION, good, bad, ""
    if _is_ancestor(repo, bad, good):
        return Direction.FIX, bad, good, ""
    old = _older_end(repo, good, bad, main_ref, good_ref, bad_ref)
    new = bad if old == good else good
    direction = Direction.REGRESSION if old == good else Direction.FIX
    base = _merge_base(repo, old, new)
    if not base:
        raise RangeError(f"{good_ref} and {bad_ref} share no history: they are not commits "
                         "of one project")
    # git bisect tests the merge base first: it stands in for the older end, and must
    # behave as that end does (designs/phases.py stops with exit 9 when it does not)
    return direction, base, new, good_ref if old == good else bad_ref


def _tags_by_sha(repo: Any) -> dict[str, list[str]]:
    tags_by_sha: dict[str, list[str]] = {}
    for tag in repo.tags:
        try:
            tags_by_sha.setdefault(tag.commit.hexsha, []).append(tag.name)
        except ValueError:
            continue
    return tags_by_sha


def _first_parent_changes(
    repo: Any, base: str, new: str
) -> list[tuple[str, int, str, list[str]]]:
    """(sha, commit time, subject, files changed) of each first-parent commit after ``base`` up
    to ``new``, oldest first; an empty range is a ``RangeError``."""
    # One git call: each first-parent commit with the files it changed against its first parent
    # (-m --first-parent shows a merge's whole change, so a merge is blamed as a unit).
    log = repo.git.log(
        "--first-parent", "-m", "--name-only", "--format=%x00%H%x01%ct%x01%s", f"{base}..{new}"
    )
    changed: list[tuple[str, int, str, list[str]]] = []
    for chunk in log.split("\x00")[1:]:
        head, _, files = chunk.partition("\n")
        sha, _, rest = head.partition("\x01")
        when, _, subject = rest.partition("\x01")
        changed.append((sha, int(when or 0), subject,
                        [f for f in files.splitlines() if f.strip()]))
    changed.reverse()  # oldest first
    if not changed:
        raise RangeError(f"the range {base[:12]}..{new[:12]} is empty")
    return changed


def placement(commit_range: CommitRange) -> list[str]:
    """What a plan says about where the range sits, one line each: the merge base standing in
    for the older end, the candidates off the main line, what the path filter left out."""
    lines = []
    old = commit_range.old_end
    fix = commit_range.direction is Direction.FIX
    new_ref = commit_range.good_ref if fix else commit_range.bad_ref
    main = _short_ref(commit_range.mainline) or "the main line"
    if old.stands_for:
        lines.append(
            f"{old.stands_for} and {new_ref} are not on one line of history (each release on a "
            f"branch of its own): the bisect starts at their merge base {old.label}, where "
            f"{old.stands_for}'s branch left {main}, tested first in {old.stands_for}'s place "
            "(as git bisect does)")
    off = commit_range.tail
    if off:
        picks = sum(1 for c in off if c.picked_from)
        lines.append(
            f"{len(off)} of {len(commit_range.candidates)} candidates live on {off[0].branch}, "
            f"not on {main}"
            + (f" ({picks} of them {'a cherry-pick' if picks == 1 else 'cherry-picks'} of "
               f"{'a main commit' if picks == 1 else 'main commits'})" if picks else "")
            + ": vLLM publishes per-commit wheels for main's commits only (#16217)")
    for why, count in commit_range.left_out:
        lines.append(f"left out {count} commits that {why}: nothing a build reads changed "
                     "there, so their compiled files are their parent's")
    return lines

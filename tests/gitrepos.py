"""Real git repositories for the range/session/CLI tests, built with the git CLI.

Every commit writes its index into ``f`` (so a ``--run`` script can read where it is in history)
and, where asked, touches other files. Dates and identities are fixed, so SHAs are reproducible:
a history asked for again in the same test session is a copy of the first one built (the same
objects, refs and SHAs; a fresh work tree and git dir of its own), not built commit by commit
again (~30 ms of git processes a commit).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": os.devnull,  # no user config (signing, hooks) leaks into the test repos
}


def git(repo: Path, *args: str, tick: int = 0) -> str:
    env = {**os.environ, **_ENV}
    stamp = f"{1_700_000_000 + tick * 60} +0000"
    env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = stamp
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


@dataclass
class Repo:
    path: Path
    main: list[str] = field(default_factory=list)  # first-parent history, oldest first
    side: list[str] = field(default_factory=list)  # commits inside merged branches
    _tick: int = 0

    def git(self, *args: str) -> str:
        self._tick += 1
        return git(self.path, *args, tick=self._tick)

    def commit(self, subject: str, files: dict[str, str]) -> str:
        for name, text in files.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", subject)
        return self.git("rev-parse", "HEAD")

    def tag(self, name: str, ref: str = "HEAD") -> None:
        self.git("tag", "-a", name, "-m", name, ref)

    def worktrees(self) -> list[str]:
        return [
            line for line in self.git("worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")
        ]


def init(path: Path) -> Repo:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "commit.gpgsign", "false")
    return Repo(path)


_BUILT: dict[tuple[object, ...], Repo] = {}


def _built_once(key: tuple[object, ...], path: Path, build: Callable[[Path], Repo]) -> Repo:
    """The repository ``build`` makes, at ``path``: built once per test session (in a folder
    of its own), copied for every later ask with the same ``key``."""
    if key not in _BUILT:
        root = Path(tempfile.mkdtemp(prefix="gitrepos-"))
        atexit.register(shutil.rmtree, root, True)
        built = build(root / "repo")
        git(built.path, "repack", "-a", "-d", "-q")  # a few files to copy, not every object
        _BUILT[key] = built
    built = _BUILT[key]
    shutil.copytree(built.path, path, symlinks=True, dirs_exist_ok=True)
    return dataclasses.replace(built, path=path, main=list(built.main), side=list(built.side))


def linear(path: Path, n: int, *, tag_every: int = 0, touch: Iterable[int] = ()) -> Repo:
    """``n`` commits on main; commit i (1-based) writes ``i`` into ``f``; commits in ``touch``
    also change ``csrc/kernel.cu``. ``tag_every=k`` tags commit k*j as v0.<j>.0 ."""
    touched = tuple(sorted(set(touch)))
    return _built_once(
        ("linear", n, tag_every, touched), path,
        lambda at: _linear(at, n, tag_every=tag_every, touch=touched),
    )


def _linear(path: Path, n: int, *, tag_every: int, touch: Iterable[int]) -> Repo:
    repo = init(path)
    touched = set(touch)
    for i in range(1, n + 1):
        files = {"f": f"{i}\n"}
        if i in touched:
            files["csrc/kernel.cu"] = f"// version {i}\n"
        repo.main.append(repo.commit(f"commit {i} (#{1000 + i})", files))
        if tag_every and i % tag_every == 0:
            repo.tag(f"v0.{i // tag_every}.0")
    return repo


def long_linear(path: Path, n: int) -> Repo:
    """As ``linear`` (commit i writes ``i`` into ``f``), for long histories: one ``git
    fast-import`` instead of three git processes a commit (252 commits in well under a second)."""
    repo = init(path)
    stream: list[str] = []
    for i in range(1, n + 1):
        data, subject = f"{i}\n", f"commit {i} (#{1000 + i})"
        stamp = f"{1_700_000_000 + i * 60} +0000"
        stream += [
            "commit refs/heads/main", f"mark :{i}",
            f"author Test <test@example.com> {stamp}",
            f"committer Test <test@example.com> {stamp}",
            f"data {len(subject)}", subject,
            *([f"from :{i - 1}"] if i > 1 else []),
            "M 100644 inline f", f"data {len(data)}", data,
        ]
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"],
                   input="\n".join(stream) + "\n", text=True, check=True,
                   env={**os.environ, **_ENV}, capture_output=True)
    git(path, "reset", "-q", "--hard", "main")
    repo.main = git(path, "rev-list", "--reverse", "main").split()
    return repo


def with_merges(path: Path, branches: Sequence[int] = (3, 2, 4)) -> Repo:
    """Main history where each step is a --no-ff merge of a feature branch of ``k`` commits,
    separated by direct commits. ``f`` keeps counting up along the *first-parent* history: the
    merge writes its main index; commits inside a branch touch only ``docs/`` (never ``f``)
    except that the merge carries the branch's ``csrc/`` change when the branch made one."""
    shape = tuple(branches)
    return _built_once(("with_merges", shape), path, lambda at: _with_merges(at, shape))


def _with_merges(path: Path, branches: Sequence[int]) -> Repo:
    repo = init(path)
    index = 1
    repo.main.append(repo.commit(f"commit {index}", {"f": f"{index}\n"}))
    repo.tag("v0.1.0")
    for b, k in enumerate(branches):
        repo.git("checkout", "-q", "-b", f"feature{b}")
        for j in range(k):
            files = {f"docs/b{b}_{j}.md": "x\n"}
            if b == 1:
                files["csrc/kernel.cu"] = f"// branch {b} commit {j}\n"
            repo.side.append(repo.commit(f"feature {b} part {j}", files))
        repo.git("checkout", "-q", "main")
        index += 1
        repo.git("merge", "-q", "--no-ff", "--no-commit", f"feature{b}")
        (path / "f").write_text(f"{index}\n")
        repo.git("add", "-A")
        repo.git("commit", "-q", "-m", f"Merge feature {b} (#{2000 + b})")
        repo.main.append(repo.git("rev-parse", "HEAD"))
        index += 1
        repo.main.append(repo.commit(f"commit {index}", {"f": f"{index}\n"}))
    repo.tag("v0.2.0")
    return repo


def write_probe(path: Path, *, flip: int, p: float = 1.0, fix: bool = False,
                untestable: Iterable[int] = (), sleep: float = 0.0,
                record: Path | None = None, journal: Path | None = None) -> str:
    """A ``--run`` script: reads ``f`` (the commit's index) and exits like ``git bisect run``.

    The bad side is ``index >= flip`` (or ``<`` for ``fix``); there a lifetime fails (exit 1)
    with probability ``p`` from ``random.Random`` seeded by the lifetime id, so a run is
    reproducible. ``PROBE_SLEEP`` in the environment overrides ``sleep``. Indices in
    ``untestable`` exit 125. ``record`` gets one line per lifetime:
    ``<lifetime> <index> <journal lines seen>``. Returns the command line for ``--run``.
    """
    path.write_text(textwrap.dedent(
        f"""
        import hashlib, os, random, sys, time
        lifetime = os.environ["BISECT_LIFETIME"]
        index = int(open("f").read())
        journal = {str(journal) if journal else ""!r}
        seen = 0
        if journal and os.path.exists(journal):
            with open(journal, "rb") as fh:
                seen = sum(1 for line in fh.read().split(b"\\n") if line.strip())
        record = {str(record) if record else ""!r}
        if record:
            with open(record, "a") as fh:
                fh.write(f"{{lifetime}} {{index}} {{seen}}\\n")
        time.sleep(float(os.environ.get("PROBE_SLEEP", {sleep!r})))
        if index in {sorted(set(untestable))!r}:
            sys.exit(125)
        bad = index < {flip} if {fix!r} else index >= {flip}
        rng = random.Random(int(hashlib.sha256(lifetime.encode()).hexdigest(), 16))
        sys.exit(1 if bad and rng.random() < {p!r} else 0)
        """
    ))
    return f"{sys.executable} -I -S {path}"


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``bisect ARGV`` in this process (as the console script runs it): exit code, stdout,
    stderr. Faster than a subprocess for loops of many small commands."""
    import contextlib
    import io

    from bisect_tool.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def bisect(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m bisect_tool ARGV`` in a subprocess (for signals and exit codes)."""
    return subprocess.run(
        [sys.executable, "-m", "bisect_tool", *argv],
        capture_output=True, text=True, timeout=timeout,
    )

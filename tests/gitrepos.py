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
import time
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


@dataclass
class ReleaseRepo(Repo):
    """A history shaped like vLLM's (its RELEASE.md, /work/shared/vllm-facts.md "How releases
    sit in the history"): every release on a branch of its own cut from main, with an RC tag,
    a version bump and cherry-picks that main never gets back, so no two release tags are on
    one line of history. ``at`` names the commits by role."""

    at: dict[str, str] = field(default_factory=dict)


#: the fix's marker: the kernel pins its block size from this commit on (vLLM PR #48391)
FIX_MARKER = "PINNED_BLOCK"


def release_branches(path: Path) -> ReleaseRepo:
    """main: m1..m18, squash-merged PRs (subjects end in ``(#PR)``); csrc/ changes at m3, m10
    (the fix: ``FIX_MARKER`` appears in csrc/kernel.cu), m12 and m15.

    - ``releases/v0.26.0`` cut at m6: a bump tagged ``v0.26.0rc1``, a cherry-pick of m7 with
      its ``-x`` trailer, then a bump tagged ``v0.26.0``; later a cherry-pick of the fix m10
      (``-x``) and a bump tagged ``v0.26.1`` (a post release reuses its branch);
      ``branch.txt`` says ``bug`` from the 0.26.0 bump on (a change only that branch has).
    - ``releases/v0.27.0`` cut at m14: a bump tagged ``v0.27.0rc1``, a cherry-pick of m15 (a
      kernel fix landed on main after the cut) WITHOUT the trailer (found by patch id), a bump
      tagged ``v0.27.0``.
    """
    return _built_once(("release_branches",), path, _release_branches)  # type: ignore[return-value]


def _release_branches(path: Path) -> ReleaseRepo:
    base = init(path)
    repo = ReleaseRepo(base.path)
    kernel = ["// rms_norm launcher", "int block = tokens < 256 ? 1024 : 256;"]
    n = 0

    def main_commit(subject: str, csrc: str | None = None) -> str:
        nonlocal n
        n += 1
        files = {f"vllm/mod{n % 3}.py": f"# {subject}\n"}
        if csrc is not None:
            kernel.append(csrc)
            files["csrc/kernel.cu"] = "\n".join(kernel) + "\n"
        sha = repo.commit(f"{subject} (#{1000 + n})", files)
        repo.main.append(sha)
        repo.at[f"m{n}"] = sha
        return sha

    def release(branch: str, at: str) -> None:
        repo.git("checkout", "-q", "-b", branch, at)

    def bump(version: str, tag: str) -> str:
        sha = repo.commit(f"[Release] Bump version to {version}", {"version.txt": f"{version}\n"})
        repo.tag(tag)
        return sha

    def pick(sha: str, trailer: bool) -> str:
        repo.git("cherry-pick", *(["-x"] if trailer else []), sha)
        return repo.git("rev-parse", "HEAD")

    repo.commit("Initial import", {"csrc/kernel.cu": "\n".join(kernel) + "\n",
                                   "branch.txt": "ok\n", "version.txt": "0.25.0\n"})
    repo.main.append(repo.git("rev-parse", "HEAD"))
    repo.at["m0"] = repo.main[0]
    for i in range(1, 7):
        main_commit(f"[Core] change {i}", csrc="// tidy" if i == 3 else None)
    release("releases/v0.26.0", repo.at["m6"])
    repo.at["rc26"] = bump("0.26.0rc1", "v0.26.0rc1")
    repo.git("checkout", "-q", "main")
    main_commit("[Bugfix] Fix the sampler's seed")  # m7
    repo.git("checkout", "-q", "releases/v0.26.0")
    repo.at["pick7"] = pick(repo.at["m7"], trailer=True)
    repo.at["bump26"] = repo.commit("[Release] Bump version to 0.26.0",
                                    {"version.txt": "0.26.0\n", "branch.txt": "bug\n"})
    repo.tag("v0.26.0")
    repo.git("checkout", "-q", "main")
    main_commit("[Frontend] change 8")
    main_commit("[Core] change 9")
    main_commit("[Bugfix][Kernel] Fix batch invariance in RMSNorm kernels by pinning block size",
                csrc=f"int block_bi = 1024; // {FIX_MARKER}")  # m10: the fix
    main_commit("[Doc] change 11")
    main_commit("[Kernel] change 12", csrc="// vectorise")
    main_commit("[Core] change 13")
    main_commit("[Misc] change 14")
    release("releases/v0.27.0", repo.at["m14"])
    repo.at["rc27"] = bump("0.27.0rc1", "v0.27.0rc1")
    repo.git("checkout", "-q", "main")
    main_commit("[Bugfix][Kernel] Fix fp8 quant launch", csrc="// fp8 fix")  # m15
    main_commit("[Core] change 16")
    repo.git("checkout", "-q", "releases/v0.27.0")
    repo.at["pick15"] = pick(repo.at["m15"], trailer=False)
    repo.at["bump27"] = bump("0.27.0", "v0.27.0")
    repo.git("checkout", "-q", "releases/v0.26.0")
    repo.at["pick10"] = pick(repo.at["m10"], trailer=True)
    repo.at["bump261"] = bump("0.26.1", "v0.26.1")
    repo.git("checkout", "-q", "main")
    main_commit("[Core] change 17")
    main_commit("[Core] change 18")
    return repo


def write_content_probe(path: Path, *, marker_means: str, file: str = "csrc/kernel.cu",
                        marker: str = FIX_MARKER, p: float = 1.0) -> str:
    """A ``--run`` script that judges a candidate by its files, as a real probe judges a build:
    ``marker`` in ``file`` means ``marker_means`` ("good" or "bad"); on the bad side a lifetime
    fails with probability ``p`` (seeded by the lifetime id, so runs are reproducible)."""
    path.write_text(textwrap.dedent(
        f"""
        import hashlib, os, random, sys
        has = {marker!r} in open({file!r}).read()
        bad = has if {marker_means!r} == "bad" else not has
        rng = random.Random(int(hashlib.sha256(os.environ["BISECT_LIFETIME"].encode())
                                .hexdigest(), 16))
        sys.exit(1 if bad and rng.random() < {p!r} else 0)
        """
    ))
    return f"{sys.executable} -I -S {path}"


def live_run(
    repo: Repo, tmp_path: Path, *, flip: int
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """A real `bisect start --run` on ``repo`` (v0.1.0 good, v0.4.0 bad) whose probe sleeps 60 s
    in each lifetime, returned once its first probe is running: (the process, its state dir,
    the probe's record of the lifetimes it began)."""
    record = tmp_path / "record.txt"
    command = write_probe(tmp_path / "probe.py", flip=flip, record=record)
    state = tmp_path / "st"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bisect_tool", "start", "--good", "v0.1.0", "--bad", "v0.4.0",
         "--run", command, "--repo", str(repo.path), "--state-dir", str(state)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PROBE_SLEEP": "60"},
    )
    deadline = time.monotonic() + 60
    while not (record.exists() and record.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc, state, record

"""``bisect start --run CMD --test-from REF --test-file PATH``: a test file from a newer commit,
run against every candidate (issue 40).

vLLM's regression test for a fix exists only from the fix on (PR #48391 brought
``tests/v1/determinism/test_rms_norm_batch_invariant.py``'s cases with it): a ``--run`` that
calls it at an older commit fails because the file is not there, not because of the bug, and
every candidate looks bad. What people do by hand is take the test from the newer commit and
put it into each checkout (``git show FIX:tests/x.py > tests/x.py``). Here the files are
exported once from ``REF`` into the state dir, outside every worktree, and copied into each
candidate's worktree at their own paths before ``CMD`` runs (the candidate's own conftest and
helpers around them); ``$BISECT_TEST_FROM`` names the exported folder, for a command that wants
them from outside.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool.errors import UsageError
from bisect_tool.recipes.limits import inside, relative_problem

#: the environment variable naming the exported folder
ENV_FOLDER = "BISECT_TEST_FROM"


@dataclass(frozen=True)
class NewerTests:
    """Files of one commit, exported outside the worktrees."""

    ref: str  # as the user named it
    sha: str
    files: tuple[str, ...]  # paths in the repository (files or folders)
    folder: Path  # where they were exported

    def to_header(self) -> dict[str, Any]:
        return {"ref": self.ref, "sha": self.sha, "files": list(self.files),
                "folder": str(self.folder)}

    @classmethod
    def from_header(cls, data: Any) -> NewerTests | None:
        if not isinstance(data, dict) or not data.get("sha"):
            return None
        return cls(str(data["ref"]), str(data["sha"]), tuple(map(str, data["files"])),
                   Path(str(data["folder"])))


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)


def export(repo: Path, ref: str, files: tuple[str, ...], state_dir: Path) -> NewerTests:
    """``files`` as they are at ``ref``, in ``<state dir>/tests-from-<sha>/``; a one-line
    UsageError naming the fix for an unknown ref or a path ``ref`` does not hold."""
    if not files:
        raise UsageError("--test-from REF needs the test file(s) to take from it: --test-file "
                         "tests/v1/determinism/test_x.py (repeatable)")
    for name in files:
        problem = relative_problem(name)
        if problem:
            raise UsageError(f"--test-file {name!r} {problem}; give a path in the repository")
    found = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if found.returncode != 0:
        raise UsageError(f"--test-from {ref}: no such commit in {repo}; give a tag, branch or "
                         "SHA that holds the test (e.g. the fix's commit)")
    sha = found.stdout.decode().strip()
    missing = [f for f in files
               if _git(repo, "cat-file", "-e", f"{sha}:{f.rstrip('/')}").returncode != 0]
    if missing:
        raise UsageError(f"--test-file {missing[0]} is not in {ref} ({sha[:12]}); give a path "
                         f"as `git show {ref}:PATH` takes it")
    folder = ensure(repo, sha, files, state_dir / f"tests-from-{sha[:12]}")
    return NewerTests(ref, sha, files, folder)


def ensure(repo: Path, sha: str, files: tuple[str, ...], folder: Path) -> Path:
    """The exported folder, exported again if a cleanup removed it (``bisect resume``)."""
    if folder.is_dir() and all((folder / f).exists() for f in files):
        return folder
    archive = _git(repo, "archive", "--format=tar", sha, "--", *files)
    if archive.returncode != 0:
        why = archive.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise UsageError(f"cannot export {', '.join(files)} from {sha[:12]}: {why[0]}")
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        for member in tar.getmembers():
            inside(partial, member.name, "archive member")
        tar.extractall(partial, filter="data")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def place(tests: NewerTests, worktree: Path) -> list[str]:
    """Copy the exported files into ``worktree`` at their own paths (replacing the candidate's
    own version, if it has one); the paths placed."""
    placed = []
    for root, _dirs, names in _walk(tests.folder):
        for name in names:
            src = root / name
            rel = src.relative_to(tests.folder).as_posix()
            dest = inside(worktree, rel, "test file")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.unlink(missing_ok=True)
            shutil.copy2(src, dest)
            placed.append(rel)
    return sorted(placed)


def _walk(folder: Path) -> list[tuple[Path, list[str], list[str]]]:
    import os

    return [(Path(r), d, f) for r, d, f in os.walk(folder)]

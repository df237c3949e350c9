"""`bisect --version` and click's shell completion, through a real `bisect` process."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest


def bisect(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bisect_tool", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )


def complete(line: str) -> list[str]:
    """What bash would offer after ``line`` (click's bash_complete protocol: type,value)."""
    words = line.split(" ")
    done = bisect(
        COMP_WORDS=line, COMP_CWORD=str(len(words) - 1), _BISECT_COMPLETE="bash_complete"
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_version_is_the_installed_package_version() -> None:
    """pip's version of pyproject.toml, with the commit where the code is a git checkout (an
    editable install says 0.1.0 for every commit; a report must name the code that ran)."""
    from bisect_tool import _SOURCE, git_commit

    done = bisect("--version")
    assert done.returncode == 0
    commit = git_commit(_SOURCE)
    suffix = f"+g{commit[:7]}" if commit else ""
    assert done.stdout == f"bisect, version {version('bisect-tool')}{suffix}\n"


def test_a_source_tree_names_its_version_not_0_unknown(tmp_path: Path) -> None:
    """The tool run from a copied source tree, never pip-installed (the lent GPU machine runs
    it from PYTHONPATH): the version comes from its pyproject.toml, and the commit from its
    git checkout where there is one (issue 32: reports said "bisect 0+unknown")."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    tree = tmp_path / "tree"
    shutil.copytree(root / "bisect_tool", tree / "bisect_tool",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(root / "pyproject.toml", tree / "pyproject.toml")
    script = ("import importlib.metadata as md, sys\n"
              "def missing(name): raise md.PackageNotFoundError(name)\n"
              "md.version = missing\n"
              "import bisect_tool; print(bisect_tool.__version__)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    assert done.stdout.strip() == version("bisect-tool"), done.stderr
    sha = "ab" * 20
    (tree / ".git" / "refs" / "heads").mkdir(parents=True)
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tree / ".git" / "refs" / "heads" / "main").write_text(sha + "\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    assert done.stdout.strip() == f"{version('bisect-tool')}+g{sha[:7]}", done.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script_for_each_shell(shell: str) -> None:
    done = bisect(_BISECT_COMPLETE=f"{shell}_source")
    assert done.returncode == 0, done.stderr
    assert "_BISECT_COMPLETE" in done.stdout and "bisect" in done.stdout


@pytest.mark.slow  # five `bisect` subprocesses under the completion protocol
def test_completes_commands_options_and_recipe_names() -> None:
    assert complete("bisect sta") == ["plain,start", "plain,status"]
    assert "plain,--good" in complete("bisect start --")
    assert complete("bisect start --recipe batch-invariance-o") == [
        "plain,batch-invariance-op", "plain,batch-invariance-op-extended"
    ]
    assert "plain,demo" in complete("bisect probe --recipe ")
    # A path is left to the shell's own file completion.
    assert complete("bisect artifacts fetch --recipe ./my") == ["file,./my"]

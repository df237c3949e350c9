"""`bisect --version` and click's shell completion, through a real `bisect` process."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version

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
    done = bisect("--version")
    assert done.returncode == 0
    assert done.stdout == f"bisect, version {version('bisect-tool')}\n"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script_for_each_shell(shell: str) -> None:
    done = bisect(_BISECT_COMPLETE=f"{shell}_source")
    assert done.returncode == 0, done.stderr
    assert "_BISECT_COMPLETE" in done.stdout and "bisect" in done.stdout


def test_completes_commands_options_and_recipe_names() -> None:
    assert complete("bisect sta") == ["plain,start", "plain,status"]
    assert "plain,--good" in complete("bisect start --")
    assert complete("bisect start --recipe batch") == [
        "plain,batch-invariance", "plain,batch-invariance-op"
    ]
    assert "plain,demo" in complete("bisect probe --recipe ")
    # A path is left to the shell's own file completion.
    assert complete("bisect artifacts fetch --recipe ./my") == ["file,./my"]

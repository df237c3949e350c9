"""Whole commits (``[artifacts] python_side = "candidate"``, issue 40): each candidate's own
Python side with its own compiled files, as vLLM's ``VLLM_USE_PRECOMPILED`` builds make them
(the checkout's Python package, the compiled files of that commit's wheel laid into it).

When ``bisect locate`` says the Python side carries the change (vLLM's fixes are often Python
config guards: #51292, #56377), swapping the compiled files over a pinned Python side can never
show it. A bisect of whole commits can: ``WholeCommitProvider`` wraps the recipe's provider,
takes the candidate's compiled swap set from it (cache, wheel index, release, source build, as
always), and adds every file of the package at that commit (``git archive``, kept in the cache
as a Python side, ``artifacts.stacks``). The swap set then holds the package whole
(``SwapSet.whole_packages``): the runtime lays it in place of the pinned package rather than
over it, and the compatibility gate has nothing to compare (the Python side is the candidate's
own). The pinned stack still gives everything else: the interpreter and the dependencies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bisect_tool.artifacts import stacks
from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.interfaces import ArtifactProvider, SwapSet

#: what a Python side holds that is no part of the package's files
_SKIP_PARTS = {"__pycache__"}


class WholeCommitProvider:
    """An ``ArtifactProvider``: the inner provider's compiled files, then the package whole."""

    def __init__(self, inner: ArtifactProvider, cache: ArtifactCache, repo: Path,
                 package: str) -> None:
        self.inner = inner
        self.cache = cache
        self.repo = repo
        self.package = package

    def get(self, commit: str, tags: Sequence[str] = ()) -> SwapSet:
        compiled = self.inner.get(commit, tags)
        side = stacks.side_from_git(self.cache, self._key(compiled), self.repo, commit,
                                    self.package, compiled)
        root = side / self.package
        # the compiled files first: the op check (the fast probe) takes the first file
        files: dict[str, Path] = {rel: side / rel for rel in compiled.files}
        for found in sorted(root.rglob("*")):
            rel = found.relative_to(side).as_posix()
            if found.is_file() and rel not in files and not _SKIP_PARTS & set(found.parts):
                files[rel] = found
        return SwapSet(
            commit, files, source=f"{compiled.source}+git", origin=compiled.origin,
            sha256=dict(compiled.sha256), whole_packages=(self.package,),
        )

    def prefetch(self, commits: Sequence[str], tags: Mapping[str, Sequence[str]]) -> None:
        self.inner.prefetch(commits, tags)

    def _key(self, compiled: SwapSet) -> str:
        """The cached side of this commit with exactly these compiled files."""
        digest = hashlib.sha256(
            "\n".join(f"{k} {v}" for k, v in sorted(compiled.sha256.items())).encode()
        ).hexdigest()[:12]
        return f"whole-{compiled.commit[:12]}-{self.package}-{digest}"

    def __getattr__(self, name: str) -> Any:
        # what callers read of the provider besides get/prefetch (its downloader, its close)
        return getattr(self.inner, name)

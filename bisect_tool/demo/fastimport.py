"""The demo history's writer: commits collected as ``git fast-import`` commands, and git itself.

Every commit records its whole tree and writes only what changed from its parent's; dates and
authors come from the caller's seeded generator, so the same seed gives the same SHAs.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

from bisect_tool.errors import InfrastructureError


class Builder:
    """Collects commits as fast-import commands; every commit writes what changed."""

    def __init__(
        self, rng: random.Random, authors: tuple[tuple[str, str], ...], skip_pr: int
    ) -> None:
        self.rng = rng
        self.authors = authors
        self.skip_pr = skip_pr  # the one PR number next_pr never hands out (a planted one's)
        self.out: list[bytes] = []
        self.mark = 0
        self.time = 0  # the caller dates the first commit
        self.times: dict[int, int] = {}
        self.pr = 46_100
        self.trees: dict[int, dict[str, str]] = {}
        self.subjects: dict[int, str] = {}
        self.objects = 0

    def next_pr(self) -> int:
        self.pr += self.rng.randint(3, 14)
        if self.pr == self.skip_pr:
            self.pr += 1
        return self.pr

    def commit(
        self,
        ref: str,
        subject: str,
        tree: dict[str, str],
        parent: int | None,
        merge: int | None = None,
        *,
        at: int | None = None,
        trailer: str = "",
    ) -> int:
        """One commit on ``ref``; ``at`` dates it (default: after the last one), ``trailer``
        ends its message (a cherry-pick's ``(cherry picked from commit X)``)."""
        self.mark += 1
        self.objects += 1
        if at is None:
            self.time += self.rng.randint(1_200, 30_000)
        when = self.time if at is None else at
        self.times[self.mark] = when
        name, email = self.rng.choice(self.authors)
        base = self.trees.get(parent, {}) if parent is not None else {}
        lines = [f"commit {ref}\nmark :{self.mark}\n".encode()]
        who = f"{name} <{email}> {when} +0000\n"
        lines.append(f"author {who}committer {who}".encode())
        body = f"\n\n{trailer}" if trailer else ""
        message = f"{subject}{body}\n\nSigned-off-by: {name} <{email}>\n".encode()
        lines.append(b"data %d\n%s\n" % (len(message), message))
        if parent is not None:
            lines.append(f"from :{parent}\n".encode())
        if merge is not None:
            lines.append(f"merge :{merge}\n".encode())
        for path in sorted(set(base) - set(tree)):
            lines.append(f"D {path}\n".encode())
        for path in sorted(tree):
            if base.get(path) != tree[path]:
                data = tree[path].encode()
                lines.append(
                    b"M 100644 inline %s\ndata %d\n%s\n" % (path.encode(), len(data), data)
                )
        self.out.append(b"".join(lines) + b"\n")
        self.trees[self.mark] = dict(tree)
        self.subjects[self.mark] = subject
        return self.mark

    def tag(self, name: str, mark: int, message: str) -> None:
        who = f"Release Bot <release@example.com> {self.times.get(mark, self.time)} +0000\n"
        data = message.encode()
        self.out.append(
            f"tag {name}\nfrom :{mark}\ntagger {who}".encode()
            + b"data %d\n%s\n" % (len(data), data)
        )


def append(tree: dict[str, str], path: str, text: str) -> None:
    tree[path] = tree.get(path, "") + text


def git(repo: Path, *args: str, data: bytes | None = None) -> str:
    try:
        result = subprocess.run(
            ["git", "-C", str(repo), *args], input=data, capture_output=True, check=False
        )
    except FileNotFoundError:
        raise InfrastructureError(
            "git is not installed: install it (apt-get install git)"
        ) from None
    if result.returncode != 0:
        raise InfrastructureError(f"git {args[0]} failed: {result.stderr.decode().strip()}")
    return result.stdout.decode()

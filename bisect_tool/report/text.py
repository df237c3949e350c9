"""Markdown pieces every renderer shares: literal text, code spans, fences, folded blocks,
tables. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any


def esc(text: Any) -> str:
    """Plain text inside Markdown: subjects like "[Bugfix][Kernel] ..." must stay literal."""
    return re.sub(r"([\\`*_\[\]<>|#~])", r"\\\1", str(text)).replace("\n", " ")


def code(text: Any) -> str:
    text = str(text)
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fence(text: str, lang: str = "") -> str:
    ticks = "`" * max(3, max((len(m) for m in re.findall(r"`{3,}", text)), default=0) + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def details(summary: str, body: Sequence[str]) -> list[str]:
    # GitHub needs the blank line after </summary> to render Markdown inside the block.
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def cell(value: Any) -> str:
    """A table cell: "-" for nothing, the text escaped (a ``|`` would split the cell)."""
    return "-" if value is None or value == "" else esc(value)


def table(head: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    """A GitHub table; ``align``: one letter a column, "l" or "r" (default: left)."""
    marks = ["---:" if (align[i:i + 1] == "r") else "---" for i in range(len(head))]
    return ["| " + " | ".join(head) + " |", "|" + "|".join(marks) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def ref(c: Mapping[str, Any]) -> str:
    """A candidate by name, linked where the link resolves (a commit of vLLM's own history)."""
    shown = code(c.get("name") or c.get("short") or "?")
    url = c.get("commit_url") or c.get("release_url")
    return f"[{shown}]({url})" if url else shown


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else (words or word + 's')}"


def delta(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.3e}"

"""Reading a report's Markdown tables as a reader sees them (the report tests' one parser)."""

from __future__ import annotations

from markdown_it import MarkdownIt


def rows(md: str) -> list[list[str]]:
    """Body rows of the first table in ``md``, each cell's text as a reader sees it."""
    out: list[list[str]] = []
    body = False
    for tok in MarkdownIt("commonmark").enable("table").parse(md):
        if tok.type == "tbody_open":
            body = True
        elif tok.type == "tbody_close":
            break
        elif body and tok.type == "tr_open":
            out.append([])
        elif body and tok.type == "inline":
            out[-1].append("".join(c.content for c in tok.children or []
                                   if c.type in ("text", "code_inline")))
    return out

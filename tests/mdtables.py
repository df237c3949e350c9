"""Reading a report's Markdown tables as a reader sees them (the report tests' one parser)."""

from __future__ import annotations

from markdown_it import MarkdownIt


def cells(md: str) -> list[list[tuple[str, list[str]]]]:
    """Body rows of the first table in ``md``: each cell as (its text as a reader sees it, the
    links it holds)."""
    out: list[list[tuple[str, list[str]]]] = []
    body = False
    for tok in MarkdownIt("commonmark").enable("table").parse(md):
        if tok.type == "tbody_open":
            body = True
        elif tok.type == "tbody_close":
            break
        elif body and tok.type == "tr_open":
            out.append([])
        elif body and tok.type == "inline":
            children = tok.children or []
            text = "".join(c.content for c in children if c.type in ("text", "code_inline"))
            hrefs = [str(c.attrGet("href")) for c in children if c.type == "link_open"]
            out[-1].append((text, hrefs))
    return out


def rows(md: str) -> list[list[str]]:
    """Body rows of the first table in ``md``, each cell's text as a reader sees it."""
    return [[text for text, _ in row] for row in cells(md)]

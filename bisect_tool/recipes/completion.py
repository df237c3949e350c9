"""Shell completion beyond what click derives from the commands themselves.

click completes commands, options and ``click.Choice``/``click.Path`` values on its own once
the shell has loaded its script (``eval "$(_BISECT_COMPLETE=bash_source bisect)"``, see the
README). A recipe is either a bundled name or a TOML path, which no click type says, so
``--recipe`` gets this completer.
"""

from __future__ import annotations

import click
from click.shell_completion import CompletionItem

from bisect_tool.recipes.recipe import bundled_names, looks_like_path


def complete_recipe(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Bundled recipe names that start with what was typed; otherwise the shell's own file
    completion (a path: it looks like one, as the loader decides (``looks_like_path``), or no
    bundled name matches)."""
    names = [n for n in bundled_names() if n.startswith(incomplete)]
    if looks_like_path(incomplete) or not names:
        return [CompletionItem(incomplete, type="file")]
    return [CompletionItem(n, help="bundled recipe") for n in names]

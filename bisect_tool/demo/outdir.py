"""Where `bisect demo` keeps what it made: one folder (``./bisect-demo-out`` by default), kept
after the run so that what the summary names is there to read, and to bisect again by hand
(issue 41: the state lived in a deleted temp folder, so `bisect status`, `log` and `report`
answered "no session" right after `make demo`).

Layout: the generated history ``demo-repo/`` (its session's state where `bisect` finds it from
inside the clone, ``demo-repo/.git/bisect-tool``), the build ``cache/``, the completed recipe
``demo-recipe.toml``, the wheels its per-commit wheel index built (``wheels/``), the report and
the plot, and ``.bisect-demo``: the names the demo wrote,
so that the next demo in the same folder removes exactly those and nothing else.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bisect_tool.errors import UsageError

MARKER = ".bisect-demo"
REPO = "demo-repo"
CACHE = "cache"
RECIPE = "demo-recipe.toml"
WHEELS = "wheels"  # the per-commit wheel index's builds (bisect_tool.demo.wheels)
#: every name a demo may write here (the report and plot are overwritten in place)
OWN = (REPO, CACHE, RECIPE, WHEELS)


def claim(folder: Path) -> None:
    """Make ``folder`` ready for a new demo: what an earlier demo wrote there (the names its
    marker lists, only ever those of ``OWN``) is removed; a history there that no demo's marker
    claims is refused, nothing deleted."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / MARKER
    listed = set(marker.read_text(encoding="utf-8").split()) if marker.is_file() else set()
    for name in OWN:
        path = folder / name
        if not (path.exists() or path.is_symlink()):
            continue
        if name not in listed:
            raise UsageError(
                f"{path} exists and no earlier demo wrote it (no {MARKER} names it); give "
                "another folder (--out, or --workdir)"
            )
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    marker.write_text("\n".join(OWN) + "\n", encoding="utf-8")

"""`bisect report`: the journal's facts (``facts``), rendered as Markdown for the issue tracker
(``markdown``), as JSON with the same content (``json_out``), and as a posterior plot (``plot``).

Every renderer takes the facts dict ``build_report`` makes, so the outputs cannot disagree.
The shape follows cargo-bisect-rustc's issue reports: the answer first, then the range and
environment, and the long parts folded into ``<details>``.
"""

from __future__ import annotations

from pathlib import Path

from bisect_tool.report.facts import REPORT_VERSION, build_report
from bisect_tool.report.json_out import render_json
from bisect_tool.report.markdown import render_markdown
from bisect_tool.report.plot import plot_posterior, text_plot
from bisect_tool.values import SearchState

__all__ = [
    "REPORT_VERSION",
    "SearchState",
    "build_report",
    "plot_posterior",
    "render_json",
    "render_markdown",
    "render_report",
    "text_plot",
]


def render_report(journal_path: Path, fmt: str = "md", plot: Path | None = None) -> str:
    """The report of the journal at ``journal_path``: Markdown (with ``plot`` written) or JSON."""
    from bisect_tool import journal, redact, session
    from bisect_tool.errors import UsageError

    contents = journal.read(journal_path)
    built = build_report(
        contents, session.replay(contents).search_state(), bundled_recipe=_bundled(contents)
    )
    # The journal is redacted as it is written; this also covers one written before that.
    if fmt == "json":
        return redact.text(render_json(built))
    written = None
    if plot is not None:
        try:
            written = plot_posterior(built, plot)
        except OSError as exc:
            raise UsageError(
                f"cannot write the plot to {plot} ({exc.strerror or exc}); give --plot a path "
                "in a folder you can write"
            ) from None
    return redact.text(render_markdown(built, plot=written))


def _bundled(contents: object) -> dict[str, object] | None:
    """The bundled recipe the run's recipe is named after, for the reproduce section's diff."""
    from bisect_tool import recipe as recipe_mod
    from bisect_tool.errors import RecipeError

    header = getattr(contents, "header", {}) or {}
    name = str((header.get("recipe") or {}).get("name") or "")
    if not name or not (recipe_mod.BUNDLED_DIR / f"{name}.toml").exists():
        return None
    try:
        return recipe_mod.load(name).to_dict()
    except RecipeError:
        return None

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
    from bisect_tool import journal, session

    contents = journal.read(journal_path)
    built = build_report(contents, session.replay(contents).search_state())
    if fmt == "json":
        return render_json(built)
    written = plot_posterior(built, plot) if plot is not None else None
    return render_markdown(built, plot=written)

"""`bisect report`: the journal's facts (``facts``), rendered as Markdown for the issue tracker
(``markdown``), as JSON with the same content (``json_out``), and as a posterior plot (``plot``);
a locate's journal has its own report (``locate``).

Every renderer takes the facts dict its builder makes, so the outputs cannot disagree. The
shape follows cargo-bisect-rustc's issue reports: the answer first, then the range and the
environment, and the long parts folded into one ``<details>``. ``render_report`` is the edge:
it reads the journal and replays it; everything it calls is pure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bisect_tool.report.facts import REPORT_VERSION, build_report
from bisect_tool.report.json_out import render_json
from bisect_tool.report.locate import build_locate_report, render_locate_markdown
from bisect_tool.report.markdown import CAP, render_markdown
from bisect_tool.report.plot import plot_posterior, text_plot
from bisect_tool.values import Standing

__all__ = [
    "CAP",
    "REPORT_VERSION",
    "Standing",
    "build_locate_report",
    "build_report",
    "bundled_recipe",
    "plot_posterior",
    "render_json",
    "render_locate_markdown",
    "render_markdown",
    "render_report",
    "text_plot",
]


def render_report(
    journal_path: Path, fmt: str = "md", plot: Path | None = None,
    link_from: Path | None = None,
) -> str:
    """The report of the journal at ``journal_path`` (a bisect's or a locate's): Markdown (with
    ``plot`` written, and linked relative to ``link_from``, the folder the report is read
    from) or JSON."""
    from bisect_tool import journal, redact
    from bisect_tool.designs import ledger
    from bisect_tool.errors import UsageError

    contents = journal.read(journal_path)
    bundled = bundled_recipe(contents)
    # The journal is redacted as it is written; this also covers one written before that.
    if contents.header.get("mode") == "locate":
        located = build_locate_report(contents, bundled)
        return redact.text(render_json(located) if fmt == "json"
                           else render_locate_markdown(located))
    built = build_report(contents, ledger.replay(contents).standing(),
                         bundled_recipe=bundled, alone=lifetimes_alone(contents))
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
    link = None
    if written is not None:
        link = Path(os.path.relpath(written.resolve(), (link_from or Path.cwd()).resolve()))
    return redact.text(render_markdown(built, plot=link))


def lifetimes_alone(contents: Any) -> float | None:
    """A tiered run's confidence from its server lifetimes alone: its faithful lifetimes under
    a plain search's prior, the op check's left out (``tiers.lifetimes_alone``, the number the
    confirm step also stops on). None for a run without an op check."""
    from bisect_tool.designs import ledger
    from bisect_tool.strategy.tiers import lifetimes_alone as alone
    from bisect_tool.strategy.tiers import plain_prior

    header = contents.header
    probe = (header.get("recipe") or {}).get("probe") or {}
    if not probe.get("narrow") or header.get("mode") != "recipe":
        return None
    state = ledger.replay(contents)
    return alone(state.strategy, plain_prior(len(state.candidates), state.settings.end_doubt))


def bundled_recipe(contents: object) -> dict[str, object] | None:
    """The bundled recipe the run's recipe is named after, for the reproduce section's diff."""
    from bisect_tool.errors import RecipeError
    from bisect_tool.recipes import recipe as recipe_mod

    header = getattr(contents, "header", {}) or {}
    name = str((header.get("recipe") or {}).get("name") or "")
    if not name or not (recipe_mod.BUNDLED_DIR / f"{name}.toml").exists():
        return None
    try:
        return recipe_mod.load(name).to_dict()
    except RecipeError:
        return None

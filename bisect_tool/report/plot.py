"""The posterior drawn: a text sparkline (always) and a PNG (with matplotlib). Both show what
the server lifetimes and, in a tiered run, the op check saw on each candidate, and name the
candidates (issue 32, item 10)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bisect_tool.values import percent

__all__ = ["plot_posterior", "text_plot"]

_LEVELS = " .:-=+*#%@"
_MARKS = {"DIVERGENT": "X", "CLEAN": "o", "UNTESTABLE": "u", "INCONCLUSIVE": "?"}
_MARK_RANK = {"X": 4, "?": 3, "o": 2, "u": 1, " ": 0}
#: candidates named on the PNG's axis: every one up to this many, else evenly spaced ones
_TICKS = 40


def _marks(rows: list[Mapping[str, Any]], n: int, cols: int) -> str:
    marks = [" "] * cols
    for r in rows:
        col = int(r["index"]) * cols // n
        mark = _MARKS.get(str(r["verdict"]), "?")
        if _MARK_RANK[mark] > _MARK_RANK[marks[col]]:
            marks[col] = mark
    return "".join(marks)


def text_plot(report: Mapping[str, Any], width: int = 64) -> str:
    """An ASCII sparkline of the posterior (binned to ``width``) over the tested positions.

    Row 1: posterior mass per bin, scaled to the largest bin. Row 2: what the lifetimes saw in
    the bin (X divergent, o clean, ? inconclusive, u untestable); row 3, in a tiered run, what
    the op check saw. Then the ends by name and the top candidates with bars.
    """
    posterior: list[float] = [float(x or 0.0) for x in report["posterior"]]
    n = len(posterior)
    cols = min(n, width)
    bins = [0.0] * cols
    for i, mass in enumerate(posterior):
        bins[i * cols // n] += mass
    top = max(bins) or 1.0
    spark = "".join(
        " " if b <= 0 else _LEVELS[max(1, round(b / top * (len(_LEVELS) - 1)))] for b in bins
    )
    commits = report["commits"]
    lines = [f"posterior |{spark}|", f"lifetimes |{_marks(report['tested'], n, cols)}|"]
    narrow = (report.get("tiers") or {}).get("rows")
    if narrow:
        lines.append(f"op check  |{_marks(narrow, n, cols)}|")

    def named(c: Mapping[str, Any]) -> str:
        return str(c.get("name") or c.get("short"))

    left, right = f"^{named(commits[0])} (old end)", f"{named(commits[-1])} (new end)^"
    lines += [
        f"           {left}{' ' * max(2, cols - len(left) - len(right))}{right}",
        "           X divergent  o clean  ? inconclusive  u untestable",
        "",
    ]
    ranked = sorted(range(n), key=lambda i: -posterior[i])[:5]
    for i in ranked:
        if posterior[i] <= 0:
            break
        bar = "#" * max(1, round(posterior[i] * 40))
        lines.append(f"{named(commits[i]):<10} #{i:<4} {posterior[i] * 100:6.2f}% {bar}")
    return "\n".join(lines).rstrip()


def plot_posterior(report: Mapping[str, Any], path: Path) -> Path | None:
    """A PNG of the posterior over the range, what the lifetimes (and the op check) saw on each
    candidate, the candidates named on the axis; None without matplotlib.

    Uses the Agg canvas directly (no pyplot): no global backend switch, no display needed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    posterior = [float(x or 0.0) for x in report["posterior"]]
    n = len(posterior)
    xs = list(range(n))
    fig = Figure(figsize=(10, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    block = {c["index"] for c in report["answer"]["flip_block"]}
    colors = ["tab:red" if i in block else "tab:blue" for i in xs]
    top.bar(xs, posterior, width=1.0, color=colors)
    top.set_ylabel("P(flip here)")
    top.set_ylim(0, max(1e-9, max(posterior)) * 1.1)
    a = report["answer"]
    noun = a.get("noun") or "commit"
    label = f"first {'good' if a['direction'] == 'fix' else 'bad'} {noun}"
    names = [str(c.get("name") or c.get("short")) for c in report["commits"]]
    found = ", ".join(names[int(c["index"])] if 0 <= int(c["index"]) < n else str(c["short"])
                      for c in a["flip_block"])
    top.set_title(f"{label}: {found} ({percent(a['confidence'])})" if found else a["state"])
    tested = report["tested"]
    idx = [r["index"] for r in tested]
    bottom.bar(idx, [r["lifetimes"] for r in tested], width=0.8, color="lightgray",
               label="lifetimes")
    bottom.bar(idx, [r["divergent"] for r in tested], width=0.8, color="tab:red",
               label="divergent")
    for r in tested:
        if r["lifetimes"]:
            bottom.annotate(f"{r['divergent']}/{r['lifetimes']}", (r["index"], r["lifetimes"]),
                            ha="center", va="bottom", fontsize=7)
    untestable = [r["index"] for r in tested if r["verdict"] == "UNTESTABLE"]
    if untestable:
        bottom.scatter(untestable, [0.0] * len(untestable), marker="x", color="black",
                       label="untestable", zorder=3)
    narrow = (report.get("tiers") or {}).get("rows") or []
    if narrow:  # the op check's verdict per candidate, above the lifetimes' bars
        height = max([1, *(int(r["lifetimes"]) for r in tested)]) * 1.25
        for verdict, marker, color in (("DIVERGENT", "v", "tab:red"), ("CLEAN", "v", "tab:green"),
                                       ("UNTESTABLE", "v", "black")):
            at = [r["index"] for r in narrow if r["verdict"] == verdict]
            if at:
                bottom.scatter(at, [height] * len(at), marker=marker, color=color, zorder=3,
                               label=f"op check: {verdict.lower()}")
        bottom.set_ylim(0, height * 1.3)
    bottom.set_ylabel("lifetimes")
    step = max(1, -(-n // _TICKS))
    ticks = list(range(0, n, step))
    bottom.set_xticks(ticks)
    bottom.set_xticklabels([names[i] for i in ticks], rotation=60, ha="right", fontsize=7)
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)  # clear of the marks
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path

"""The posterior drawn: a text sparkline (always) and a PNG (with matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def pct(x: float | None) -> str:
    """A share as a percentage that never rounds a near-certainty up to 100%."""
    if x is None:
        return "-"
    digits = 1
    while digits < 4 and x < 1 and round(x * 100, digits) >= 100:
        digits += 1  # 0.9997 must not print as 100.0%
    return f"{x * 100:.{digits}f}%"



_LEVELS = " .:-=+*#%@"
_MARKS = {"DIVERGENT": "X", "CLEAN": "o", "UNTESTABLE": "u", "INCONCLUSIVE": "?"}
_MARK_RANK = {"X": 4, "?": 3, "o": 2, "u": 1, " ": 0}


def text_plot(report: Mapping[str, Any], width: int = 64) -> str:
    """An ASCII sparkline of the posterior (binned to ``width``) over the tested positions.

    Row 1: posterior mass per bin, scaled to the largest bin. Row 2: what was seen in the bin
    (X divergent, o clean, ? inconclusive, u untestable). Then the top commits with bars.
    """
    posterior: list[float] = [float(x or 0.0) for x in report["posterior"]]
    n = len(posterior)
    cols = min(n, width)
    bins = [0.0] * cols
    marks = [" "] * cols
    for i, mass in enumerate(posterior):
        bins[i * cols // n] += mass
    for r in report["tested"]:
        col = r["index"] * cols // n
        mark = _MARKS.get(r["verdict"], "?")
        if _MARK_RANK[mark] > _MARK_RANK[marks[col]]:
            marks[col] = mark
    top = max(bins) or 1.0
    spark = "".join(
        " " if b <= 0 else _LEVELS[max(1, round(b / top * (len(_LEVELS) - 1)))] for b in bins
    )
    commits = report["commits"]
    left, right = f"^{commits[0]['short']} (old end)", f"{commits[-1]['short']} (new end)^"
    lines = [
        f"posterior |{spark}|",
        f"tested    |{''.join(marks)}|",
        f"           {left}{' ' * max(2, cols - len(left) - len(right))}{right}",
        "           X divergent  o clean  ? inconclusive  u untestable",
        "",
    ]
    ranked = sorted(range(n), key=lambda i: -posterior[i])[:5]
    for i in ranked:
        if posterior[i] <= 0:
            break
        bar = "#" * max(1, round(posterior[i] * 40))
        lines.append(f"{commits[i]['short']} #{i:<4} {posterior[i] * 100:6.2f}% {bar}")
    return "\n".join(lines).rstrip()


def plot_posterior(report: Mapping[str, Any], path: Path) -> Path | None:
    """A PNG of the posterior over the range and the evaluations made; None without matplotlib.

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
    top.set_ylabel("P(flip at commit)")
    top.set_ylim(0, max(1e-9, max(posterior)) * 1.1)
    a = report["answer"]
    label = "first good" if a["direction"] == "fix" else "first bad"
    title = f"{a['state']}: {label} " + ", ".join(c["short"] for c in a["flip_block"])
    top.set_title(f"{title} (confidence {pct(a['confidence'])})")
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
    bottom.set_ylabel("lifetimes")
    bottom.set_xlabel(f"candidate index (0 = {report['commits'][0]['short']}, old end)")
    bottom.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path

"""The report as Markdown for an issue tracker, from the facts dict (``report.facts``)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bisect_tool.probes.render import render_op_detail, render_server_detail
from bisect_tool.report.facts import SHORT
from bisect_tool.report.plot import pct as _pct
from bisect_tool.report.plot import text_plot

_CREDIBLE_SHOWN = 8  # credible-set commits listed inline in a one-liner before "and N more"


def _esc(text: Any) -> str:
    """Plain text inside Markdown: subjects like "[Bugfix][Kernel] ..." must stay literal."""
    return re.sub(r"([\\`*_\[\]<>|#~])", r"\\\1", str(text)).replace("\n", " ")


def _code(text: Any) -> str:
    text = str(text)
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _fence(text: str, lang: str = "") -> str:
    ticks = "`" * max(3, max((len(m) for m in re.findall(r"`{3,}", text)), default=0) + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _f2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _link(c: Mapping[str, Any], with_subject: bool = True) -> str:
    out = f"[{_code(c['short'])}]({c['commit_url']})"
    if with_subject and c.get("subject"):
        out += f" {_esc(c['subject'])}"
    if c.get("pr_url"):
        out += f" ([#{c['pr']}]({c['pr_url']}))"
    return out


def _pr_cell(c: Mapping[str, Any]) -> str:
    return f"[#{c['pr']}]({c['pr_url']})" if c.get("pr_url") else "-"


def _shas(commits: Sequence[Mapping[str, Any]]) -> str:
    shown = ", ".join(_link(c, with_subject=False) for c in commits[:_CREDIBLE_SHOWN])
    more = len(commits) - _CREDIBLE_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _estimates(a: Mapping[str, Any]) -> str:
    size = len(a["credible_set"])
    p = (f", estimated p = {_f2(a['p_median'])} [{_f2(a['p_interval'][0])}, "
         f"{_f2(a['p_interval'][1])}]" if a.get("p_median") is not None else "")
    return (f"confidence {_pct(a['confidence'])}, credible set (90%): "
            f"{size} commit{'s' if size != 1 else ''}{p}")


def _answer_lines(report: Mapping[str, Any]) -> list[str]:
    a = report["answer"]
    label = "First good commit" if a["direction"] == "fix" else "First bad commit"
    kind = f"**{label}** ({a['direction']})"
    block = a["flip_block"]
    state = a["state"]
    done_line: list[str]
    if len(block) == 1:
        done_line = [f"{kind}: {_link(block[0])} — {_estimates(a)}"]
    elif block:
        # As `git bisect` says when skipped commits surround the flip.
        done_line = [f"{kind} could be any of these {len(block)} commits (the ones between "
                     f"could not be tested) — {_estimates(a)}:", ""]
        done_line += [f"- {_link(c)}" for c in block]
    else:
        done_line = [f"{kind}: none found — {_estimates(a)}"]
    credible = _shas(a["credible_set"]) or "empty"
    end_message = a.get("end_message")
    reason = f" ({_esc(end_message)})" if end_message else ""
    controls = report.get("controls") or {}
    if state == "done":
        return done_line
    if state == "bad_end_never_reproduced":
        rng = report["range"]
        ref = f"{_code(rng['bad_ref'])} " if rng.get("bad_ref") else ""
        return [f"**Nothing to bisect**: the bad end ({ref}{_code(rng['bad_sha'][:SHORT])}) "
                f"never showed the bug in {a['bad_end_lifetimes']} lifetimes{reason}. Check "
                "the recipe reproduces it there (controls, co-residency, jitter) before "
                "bisecting."]
    if state == "controls_failed":
        problem = controls.get("problem") or "the positive or negative control did not hold"
        return [f"**Controls failed**: {_esc(problem)}. CLEAN results are not trusted, so "
                "no commit is named."]
    if state == "budget_exhausted":
        head = (f"**Inconclusive: budget exhausted** after {a['evaluations']} lifetimes{reason}; "
                f"the 90% credible set is {credible}. Best guess so far:")
    elif state == "no_candidate_left":
        head = (f"**Inconclusive: no testable candidate left**{reason}; the 90% credible set "
                f"is {credible}. Best guess so far:")
    elif state == "aborted":
        head = (f"**Aborted** after {a['evaluations']} lifetimes{reason}; the 90% credible set "
                f"is {credible}. Best guess so far:")
    elif state == "running":
        head = (f"**Still running** ({a['evaluations']} lifetimes so far); the 90% credible set "
                f"is {credible}. Best guess so far:")
    else:
        head = f"**State: {_esc(state)}**{reason}. Best guess so far:"
    return [head, "", *done_line]


def _env_line(report: Mapping[str, Any]) -> str:
    env = report.get("environment") or {}
    if not env:
        return "- Environment: not recorded"
    return "- Environment: " + "; ".join(f"{_esc(k)} {_code(v)}" for k, v in env.items())


def _recipe_line(report: Mapping[str, Any]) -> str:
    r = report.get("recipe") or {}
    parts = [f"recipe {_code(r.get('name') or '?')}"]
    if r.get("model"):
        parts.append(f"model {_code(r['model'])}"
                     + (f" (weights {_code(r['weights'])})" if r.get("weights") else ""))
    if r.get("image"):
        parts.append(f"image {_code(r['image'])}")
    if r.get("env"):
        parts.append("env " + " ".join(_code(f"{k}={v}") for k, v in r["env"].items()))
    if r.get("server_args"):
        parts.append(f"server args {_code(shlex.join(r['server_args']))}")
    if r.get("swap_set"):
        parts.append("swap set " + ", ".join(_code(s) for s in r["swap_set"]))
    probe = dict(r.get("probe") or {})
    kind = probe.pop("kind", "?")
    if probe:
        parts.append(f"probe {_code(kind)}: " + ", ".join(
            f"{k.replace('_', ' ')} {_code(json.dumps(v) if isinstance(v, list) else v)}"
            for k, v in probe.items()))
    return "- Recipe: " + "; ".join(parts)


def _range_line(report: Mapping[str, Any]) -> str:
    rng = report["range"]
    url = report["repo_url"]

    def end(ref: Any, sha: str, label: str) -> str:
        sha_link = f"[{_code(sha[:SHORT])}]({url}/commit/{sha})"
        return f"{label} {_code(ref)} ({sha_link})" if ref else f"{label} {sha_link}"

    goal = "first good commit" if rng["direction"] == "fix" else "first bad commit"
    return (f"- Range: {end(rng.get('good_ref'), rng['good_sha'], 'good')}, "
            f"{end(rng.get('bad_ref'), rng['bad_sha'], 'bad')}; {rng['direction']} (looking "
            f"for the {goal}); {rng['candidates']} candidates, ends included "
            f"([compare]({rng['compare_url']}))")


def _controls_lines(report: Mapping[str, Any]) -> list[str]:
    c = report.get("controls")
    if c is None:
        return ["- Controls: not run; a CLEAN lifetime is unverified evidence"]
    pos, neg = c["positive"], c["negative"]
    lines = [
        f"- Positive control (invariance off, concurrent): **{pos['verdict']}**"
        + (f" — {_esc(pos['message'])}" if pos["message"] else ""),
        f"- Negative control (one request at a time): **{neg['verdict']}**"
        + (f" — {_esc(neg['message'])}" if neg["message"] else ""),
    ]
    if not c["positive_diverged"]:
        lines += ["", "> [!WARNING]", "> The positive control did not diverge: the probe was not "
                  "shown able to see the bug on this stack, so CLEAN lifetimes prove nothing."]
    return lines


def _cell(value: Any) -> str:
    return "-" if value is None else _esc(value)


def _delta_cell(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.3e}"


def _table(report: Mapping[str, Any]) -> list[str]:
    delta_name = "Max abs diff" if report.get("probe_kind") == "op" else "Max abs Δ logprob"
    head = ["#", "Commit", "PR", "Lifetimes", "Divergent", "Distinct outputs", delta_name,
            "Co-residency", "Verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["tested"]:
        pos = str(r["index"]) + (f" ({r['role']})" if r["role"] else "")
        distinct = "-" if r["distinct_outputs"] is None else (
            f"{r['distinct_outputs']}/{r['repeats']}" if r["repeats"]
            else str(r["distinct_outputs"]))
        cores = "-"
        if r["max_coresidency"] is not None:
            low = r.get("min_coresidency")
            cores = (f"{low}–{r['max_coresidency']}" if low is not None
                     and low != r["max_coresidency"] else str(r["max_coresidency"]))
            if r["target_coresidency"]:
                cores += f"/{r['target_coresidency']}"
        cells = [pos, f"[{_code(r['short'])}]({r['commit_url']})", _pr_cell(r),
                 str(r["lifetimes"]), str(r["divergent"]), distinct,
                 _delta_cell(r["max_abs_delta"]), cores, f"**{r['verdict']}**"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _render_detail(detail: Mapping[str, Any]) -> str:
    if not detail:
        return ""
    if "groups" in detail or "row_counts" in detail:
        return render_op_detail(detail)
    if any(k in detail for k in ("distinct_outputs", "coresidency_per_repeat", "mode")):
        return render_server_detail(detail)
    scalars = [(k, v) for k, v in detail.items()
               if k != "log_tail" and isinstance(v, str | int | float | bool) and v != ""]
    if not scalars:
        return ""
    return "\n".join(["| | value |", "|---|---|",
                      *(f"| {_esc(k)} | {_cell(v)} |" for k, v in scalars)])


def _details(summary: str, body: Sequence[str]) -> list[str]:
    # GitHub needs the blank line after </summary> to render Markdown inside the block.
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def _candidate_details(report: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    by_index: dict[int, list[Mapping[str, Any]]] = {}
    for lt in report["lifetimes"]:
        by_index.setdefault(lt["index"], []).append(lt)
    for r in report["tested"]:
        body: list[str] = []
        if r["untestable"]:
            body += [f"**Untestable**: {_esc(r['untestable_message'] or 'no reason recorded')}",
                     ""]
        for lt in by_index.get(r["index"], []):
            took = f", {lt['duration_s']:.0f} s" if isinstance(lt["duration_s"], int | float) \
                else ""
            body += [f"**Lifetime {_code(lt['lifetime_id'] or '?')}**: {lt['verdict']}{took}"]
            if lt["message"]:
                body += ["", _esc(lt["message"])]
            table = _render_detail(lt["detail"])
            if table:
                body += ["", table]
            if lt["log_tail"]:
                body += ["", "Log tail:", "", _fence(lt["log_tail"], "text")]
            body.append("")
        n = r["lifetimes"]
        summary = (f"{r['short']} ({r['verdict'].lower()}): {n} lifetime{'s' if n != 1 else ''}"
                   f", {r['divergent']} divergent")
        out += _details(summary, body)
    return out


def render_markdown(report: Mapping[str, Any], *, plot: Path | str | None = None) -> str:
    """The report for an issue: the answer, the setup, the table; the rest in ``<details>``.

    ``plot`` (or ``report["plot"]``): a PNG written by :func:`plot_posterior`; without one the
    text plot is shown instead.
    """
    plot = plot if plot is not None else report.get("plot")
    lines: list[str] = ["## Bisect result", "", *_answer_lines(report), ""]
    a = report["answer"]
    if a["state"] not in ("bad_end_never_reproduced", "controls_failed") and (
        a.get("q_median") is not None
    ):
        lines += [f"{a['evaluations']} lifetimes on {a['candidates_tested']} candidates; "
                  f"false-alarm rate q = {_f2(a['q_median'])} [{_f2(a['q_interval'][0])}, "
                  f"{_f2(a['q_interval'][1])}].", ""]
    version = report.get("tool_version")
    lines += ["### Setup", "", _range_line(report), _env_line(report), _recipe_line(report),
              f"- Tool: bisect {_code(version or 'unknown')}", "", "### Controls", "",
              *_controls_lines(report), "", "### Tested candidates", ""]
    if report["tested"]:
        lines += _table(report)
    else:
        lines.append("No candidate was tested.")
    lines += ["", "### Details", "", *_candidate_details(report)]
    if report.get("reproduce"):
        lines += _details("Command to reproduce", [_fence(report["reproduce"], "sh")])
    if plot:
        posterior = [f"![posterior over the range]({Path(plot).as_posix()})"]
    else:
        posterior = [_fence(text_plot(report), "text")]
    lines += _details("Posterior over the range", posterior)
    return "\n".join(lines).rstrip() + "\n"

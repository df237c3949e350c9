"""The report as Markdown for an issue tracker, from the facts dict (``report.facts``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bisect_tool.probes.render import render_op_detail, render_server_detail
from bisect_tool.report.facts import short_ref
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


def _pct_bound(x: float | None) -> str:
    if x is None:
        return "-"
    return "< 0.1%" if x < 0.001 else _pct(x)


def _commit_ref(c: Mapping[str, Any]) -> str:
    """A commit: linked only where the link exists (a commit of the vLLM remote)."""
    short = _code(c["short"])
    return f"[{short}]({c['commit_url']})" if c.get("commit_url") else short


def _answer_line(report: Mapping[str, Any]) -> list[str]:
    a = report["answer"]
    noun = "release" if (report.get("range") or {}).get("level") == "release" else "commit"
    label = f"First good {noun}" if a["direction"] == "fix" else f"First bad {noun}"
    block = a["flip_block"]
    conf = _pct(a["confidence"])
    claim = (f"**{conf}** that this is the {label.lower()} and both ends behave as given")
    if len(block) == 1:
        c = block[0]
        pr = f" ([#{c['pr']}]({c['pr_url']}))" if c.get("pr_url") else (
            f" (#{c['pr']})" if c.get("pr") else "")
        return [f"**{label}**: {_commit_ref(c)} {_esc(c.get('subject') or '')}{pr} — {claim}"]
    if block:
        lines = [f"**{label}** could be any of these {len(block)} commits (the ones between "
                 f"could not be tested) — **{conf}**:", ""]
        return lines + [f"- {_commit_ref(c)} {_esc(c.get('subject') or '')}" for c in block]
    return [f"**{label}**: none found"]


def _state_lines(report: Mapping[str, Any]) -> list[str]:
    """For a search that ended without an answer: what happened, first."""
    a = report["answer"]
    state = a["state"]
    end_message = a.get("end_message")
    reason = f": {_esc(end_message)}" if end_message else ""
    credible = ", ".join(_commit_ref(c) for c in a["credible_set"][:_CREDIBLE_SHOWN]) or "empty"
    if state == "bad_end_never_reproduced":
        rng = report["range"]
        ref = f"{_code(rng['bad_ref'])} " if rng.get("bad_ref") else ""
        return [f"**Nothing to bisect**: the bad end ({ref}{_code(short_ref(rng['bad_sha']))}) "
                f"never showed the bug in {a['bad_end_lifetimes']} lifetimes{reason}. Check "
                "the recipe reproduces it there (controls, co-residency, jitter) before "
                "bisecting."]
    if state == "ends_contradict":
        return [f"**An end is not what it was said to be**{reason}. No commit is named."]
    if state == "controls_failed":
        problem = (report.get("controls") or {}).get("problem") or "a control did not hold"
        return [f"**Controls failed**: {_esc(problem)}. CLEAN results are not trusted, so "
                "no commit is named."]
    if state == "end_untestable":
        return [f"**An end is untestable**{reason}."]
    words = {"budget_exhausted": "Inconclusive: budget exhausted",
             "no_candidate_left": "Inconclusive: no testable candidate left",
             "running": "Still running"}.get(state, f"Stopped ({_esc(state)})")
    return [f"**{words}** after {a['evaluations']} lifetimes{reason}; the 90% credible set is "
            f"{credible}. Best guess so far:", "", *_answer_line(report)]


def _rests_on_line(report: Mapping[str, Any]) -> str:
    r = report["rests_on"]
    a = report["answer"]
    controls = report.get("controls")

    def side(name: str) -> str:
        n, d = r[name]["lifetimes"], r[name]["divergent"]
        what = name.replace("_", " ")
        stand_in = r.get(f"{name}_stand_in")
        if stand_in:  # the end itself could not be run
            m, e = stand_in["lifetimes"], stand_in["divergent"]
            return (f"the {what} untestable, {_code(stand_in['name'])} standing in for it with "
                    f"{m} lifetime{'s' if m != 1 else ''} ({e} divergent)")
        return f"{n} lifetime{'s' if n != 1 else ''} of the {what} ({d} divergent)"

    if controls is None:
        held = "controls not run (a CLEAN lifetime is unverified evidence)"
    else:
        held = (f"controls {r['controls']} (positive {controls['positive']['verdict']}, "
                f"negative {controls['negative']['verdict']})")
    others = (f"{r['other_lifetimes']} on {r['other_candidates']} other candidate"
              f"{'s' if r['other_candidates'] != 1 else ''}")
    return (f"- Rests on: {side('bad_end')}, {side('good_end')}, {others}; {held}; "
            f"P(the flip lies beyond the good end) {_pct_bound(a.get('good_end_doubt'))}, "
            f"P(the bad end does not show the bug) {_pct_bound(a.get('bad_end_doubt'))}")


def _rate(name: str, median: Any, interval: Sequence[Any], has_data: bool) -> str:
    if not has_data or median is None:
        return f"{name} = prior (no lifetimes behind it yet)"
    return f"{name} = {_f2(median)} [{_f2(interval[0])}, {_f2(interval[1])}]"


def _rates_line(report: Mapping[str, Any]) -> str:
    a, rates = report["answer"], report["rates"]
    return ("- Rates (median [90% interval]): the bug shows in a bad-side lifetime with "
            + _rate("p", a["p_median"], a["p_interval"], rates["p_has_data"])
            + "; false alarms on the good side "
            + _rate("q", a["q_median"], a["q_interval"], rates["q_has_data"]))


def _searched_line(report: Mapping[str, Any]) -> str:
    rng = report["range"]
    compare = f" ([compare]({rng['compare_url']}))" if rng.get("compare_url") else ""
    return f"- Searched: {_esc(report['headline']['searched'])}{compare}"


def _probe_line(report: Mapping[str, Any]) -> str:
    if report.get("run_command"):  # --run: no recipe; the probe is the user's command
        return f"- Probe: `--run` {_code(report['run_command'])} (exit codes as git bisect run)"
    r = report.get("recipe") or {}
    kind = (r.get("probe") or {}).get("kind") or "server"
    return f"- Probe: recipe {_code(r.get('name') or 'none')} ({kind} probe)"


def _release_lines(report: Mapping[str, Any]) -> list[str]:
    """Release level: what was listed and left out, and the next step (the commits between the
    two releases). Commit level after a release-level run: what that run found."""
    lines = []
    r = report.get("releases")
    if r:
        where = _esc(r.get("index_url") or "?")
        source = {"index": "", "cache": " (offline: the listing cached from it)",
                  "artifact-cache": " (offline: the releases in the artifact cache)"}.get(
            str(r.get("listing_source")), "")
        left = ", ".join(f"{_esc(x['version'])} ({_esc(x['why'])})" for x in r["left_out"])
        lines.append(f"- Releases of {_code(r.get('package') or '?')} listed from {where}{source}"
                     + (f"; left out: {left}" if left else ""))
        step = r.get("next_step")
        if step:
            paths = (f" (candidates: the commits touching {', '.join(step['paths'])})"
                     if step["paths"] else "")
            lines.append(f"- Next: the commits between {_code(step['old'])} and "
                         f"{_code(step['new'])}{paths}, in a vLLM clone: "
                         f"{_code(step['command'])}")
    prev = report.get("previous")
    if prev:
        lines.append(
            f"- Narrowed first over {prev.get('candidates')} releases "
            f"({_esc(prev.get('bad_ref'))} .. {_esc(prev.get('good_ref'))}): the first "
            f"{'good' if report['answer']['direction'] == 'fix' else 'bad'} release was "
            f"{_code(prev.get('flip_label'))} ({_pct(prev.get('confidence'))}, "
            f"{prev.get('lifetimes')} lifetimes); its lifetimes of the two releases are carried "
            f"into this run (release journal: {_code(prev.get('journal'))})")
    return lines


def _side(side: Mapping[str, Any]) -> str:
    n, d = side["lifetimes"], side["divergent"]
    ref = f"[{_code(side['name'])}]({side['commit_url']})" if side.get("commit_url") else _code(
        side["name"])
    return f"{ref}: {d} of {n} lifetime{'s' if n != 1 else ''} divergent"


def _tier_lines(report: Mapping[str, Any]) -> list[str]:
    """Why a tiered answer holds: where the fast probe put the flip, what the faithful
    lifetimes saw on both sides of it, and how likely the fast probe is a valid stand-in."""
    t = report["tiers"]
    kind = t.get("kind") or "fast"
    lines = [f"- Narrowed by the {kind} probe: {t['narrow_runs']} runs on "
             f"{t['narrow_candidates']} candidates put the flip at {_code(t['narrow_flip'])} "
             f"({_pct(t['narrow_confidence'])})"]
    sides = t.get("sides")
    if t.get("phase") == "confirm" and sides:
        lines.append(
            f"- Confirmed by {t['faithful_lifetimes']} faithful lifetimes on both sides of it "
            f"(these alone carry the answer, scored as always with p and q integrated out): "
            f"last with the bug {_side(sides['bad'])}; first without {_side(sides['good'])}; "
            f"P(the {kind} probe is a valid stand-in here) "
            f"{_pct(t['stand_in_probability'])} (prior {_pct(t['stand_in_prior'])})")
    elif t.get("phase") == "faithful":
        reason = next((p["message"] for p in reversed(t["phases"]) if p["phase"] == "faithful"),
                      "")
        lines.append(f"- The plain search took over: {_esc(reason)}")
    if t.get("gate_rejected"):
        names = ", ".join(f"{_code(r['name'])}" for r in t["gate_rejected"])
        lines.append(f"- The pinned stack rejects the extension of {names} (the faithful "
                     "probe cannot run them; see the tiers section)")
    return lines


def _first_problem(gate: str) -> str:
    """A gate message as a table cell: the op and what happened, not both schemas in full
    (``bisect log`` and the JSON report keep the whole message)."""
    head = gate.split(": pinned '", 1)[0]
    more = re.search(r"\(and \d+ more\)$", gate)
    return head + (f" {more.group(0)}" if more and more.group(0) not in head else "")


def _tier_section(report: Mapping[str, Any]) -> list[str]:
    t = report["tiers"]
    kind = t.get("kind") or "fast"
    lines = ["### Tiers", ""]
    for p in t["phases"]:
        lines.append(f"- {_esc(p['phase'])}: {_esc(p['message'])}")
    if not t["phases"]:
        lines.append(f"- narrowing with the {kind} probe (still running)")
    rows = ["| candidate | runs | verdict | gate | what it saw |", "|---|---:|---|---|---|"]
    for r in t["narrow"]:
        ref = (f"[{_code(r['name'])}]({r['commit_url']})" if r.get("commit_url")
               else _code(r["name"]))
        gate = "-" if r["gate"] is None else ("ok" if r["gate"] == "ok" else _esc(
            _first_problem(r["gate"])))
        rows.append(f"| {ref} | {r['runs']} | {r['verdict']} | {gate} | "
                    f"{_esc(r['message'][:160])} |")
    lines += [""]
    lines += _details(f"The {kind} probe's runs ({t['narrow_runs']} on "
                      f"{t['narrow_candidates']} candidates)", rows)
    return lines


def _symptom_line(report: Mapping[str, Any]) -> list[str]:
    sym = report.get("symptom")
    if not sym:
        return []
    seen = _esc(sym["seen"]) if sym.get("seen") else "not reproduced here"
    return [f"- Symptom: reported {_esc(sym['reported'])}; seen here: {seen}"]


def _prs_lines(report: Mapping[str, Any]) -> list[str]:
    prs = report["prs"]
    if not prs["items"]:
        return []
    what = ("Pull requests in the range that touch the compiled sources "
            f"({', '.join(_code(p) for p in report['range']['paths'])})"
            if prs["filtered_by_paths"] else "Pull requests in the range")
    lines = ["### Changes in the range", "", f"{what}:", ""]
    for item in prs["items"]:
        number = f"[#{item['pr']}]({item['url']})" if item.get("url") else f"#{item['pr']}"
        lines.append(f"- {number} {_esc(item['subject'])} ({_code(item['short'])})")
    if prs["more"]:
        lines.append(f"- and {prs['more']} more")
    return [*lines, ""]


def _environment_lines(report: Mapping[str, Any]) -> list[str]:
    rows = report.get("environment_block") or []
    if not rows:
        return ["### Environment", "", "Not recorded.", ""]
    return ["### Environment", "", "| What | Value |", "|---|---|",
            *(f"| {_esc(k)} | {_esc(v)} |" for k, v in rows), ""]


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


def _evidence_table(report: Mapping[str, Any]) -> list[str]:
    """Every lifetime, one row; the candidate's verdict on its first row."""
    op = report.get("probe_kind") == "op"
    delta = "Max abs diff between launch sizes" if op else "Max \\|Δ logprob\\| across repeats"
    head = ["Candidate", "Lifetime", "Verdict", "Co-residency reached / target",
            "Distinct outputs / repeats", delta, "First divergent token", "What moved"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tested = {r["index"]: r for r in report["tested"]}
    seen: set[int] = set()
    # grouped by candidate (range order), each candidate's lifetimes in journal order: lifetimes
    # that ran in parallel interleave in the journal
    ordered = sorted(report["lifetimes"], key=lambda lt: (lt["index"], lt.get("seq") or 0))
    for lt in ordered:
        r = tested.get(lt["index"])
        if r is None:
            continue
        cand = "″"
        if lt["index"] not in seen:
            seen.add(lt["index"])
            role = f"{r['role']}, " if r["role"] else ""
            cand = f"{_commit_ref(r)} ({role}{r['verdict']})"
        cores = "-" if lt["coresidency"] is None else (
            f"{lt['coresidency']} / {lt['target']}" if lt.get("target") else str(lt["coresidency"]))
        distinct = "-" if lt["distinct_outputs"] is None else (
            f"{lt['distinct_outputs']} / {lt['repeats']}" if lt.get("repeats")
            else str(lt["distinct_outputs"]))
        first = lt.get("first_divergent_position")
        cells = [cand, _code(lt["lifetime_id"] or "?"), f"**{lt['verdict']}**", cores, distinct,
                 _delta_cell(lt["max_abs_delta"]), "-" if first is None else str(first),
                 lt.get("moved") or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    for u in report["untestable"]:
        if not u.get("lifetimes"):  # those with lifetimes have their rows above
            lines.append(f"| {_code(u['short'])} | - | **UNTESTABLE** | - | - | - | - | - |")
    return lines


def _untestable_lines(report: Mapping[str, Any]) -> list[str]:
    return [f"- {_code(u.get('name') or u['short'])} untestable: "
            f"{_esc(u['message'] or 'no reason recorded')}" for u in report["untestable"]]


def _reproduce_lines(report: Mapping[str, Any]) -> list[str]:
    lines = ["### Reproduce", ""]
    if report.get("reproduce"):
        lines += ["The bisect:", "", _fence(report["reproduce"], "sh"), ""]
    changes = report.get("reproduce_recipe") or []
    name = (report.get("recipe") or {}).get("name") or "?"
    if changes:
        by_section: dict[str, list[str]] = {}
        for section, line in changes:
            by_section.setdefault(section, []).append(line)
        toml = "\n\n".join(f"[{sec}]\n" + "\n".join(ls) for sec, ls in by_section.items())
        lines += [f"with these values changed from the bundled recipe {_code(name)} "
                  "(`--recipe FILE` with them):", "", _fence(toml, "toml"), ""]
    one = report.get("reproduce_lifetime")
    if one:
        lines += ["One lifetime by hand (boot the server, then run the probe against it):", "",
                  _fence(f"{one['server']}\n{one['client']}", "sh"), ""]
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
    """The report for an issue: the answer in words and what it rests on, the changes in the
    range, the environment, the evidence, how to reproduce; the long parts in ``<details>``.

    ``plot`` (or ``report["plot"]``): a PNG written by :func:`plot_posterior`; without one the
    text plot is shown, and neither below ``PLOT_MIN_CANDIDATES`` candidates.
    """
    a = report["answer"]
    words = report["headline"].get("words")
    title = f"## Bisect result: {words}" if words else "## Bisect result"
    lines: list[str] = [title, ""]
    lines += _answer_line(report) if a["state"] == "done" else _state_lines(report)
    lines += ["", _searched_line(report), _probe_line(report)]
    lines += _release_lines(report)
    if report.get("tiers"):
        lines += _tier_lines(report)
    if a["state"] not in ("controls_failed",):
        if not report.get("tiers") or (report["tiers"].get("phase") != "confirm"):
            lines.append(_rests_on_line(report))
        lines.append(_rates_line(report))
    lines += [*_symptom_line(report), ""]
    lines += _prs_lines(report)
    lines += _environment_lines(report)
    lines += ["### Evidence", ""]
    if report["lifetimes"] or report["untestable"]:
        lines += _evidence_table(report)
        if report["untestable"]:
            lines += ["", *_untestable_lines(report)]
    else:
        lines.append("No lifetime ran.")
    lines += ["", "### Controls", "", *_controls_lines(report), ""]
    if report.get("tiers"):
        lines += _tier_section(report)
    lines += _reproduce_lines(report)
    lines += _details("Every lifetime in detail (tables and log tails)",
                      _candidate_details(report))
    if report.get("show_plot"):
        plot = plot if plot is not None else report.get("plot")
        if plot:
            posterior = [f"![posterior over the range]({Path(plot).as_posix()})"]
        else:
            posterior = [_fence(text_plot(report), "text")]
        lines += _details("Posterior over the range", posterior)
    lines.append(f"<sub>bisect {_esc(report.get('tool_version') or 'unknown')}, session "
                 f"{_esc(report.get('session') or '?')}</sub>")
    return "\n".join(lines).rstrip() + "\n"

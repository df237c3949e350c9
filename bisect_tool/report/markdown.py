"""The bisect's report as Markdown for the issue tracker, from the facts dict (``report.facts``).

Read as a vLLM maintainer pasting it into the issue (issue 32): the first lines state the
finding (the release or commit, how sure, what changed) and four lines under it; then short
sections with numbers a reader can check (how sure, the lifetimes, the controls, the op check,
the environment and how it differs from the reported setup); everything long in one
``<details>`` at the end, as cargo-bisect-rustc ends its reports. The whole stays under
GitHub's comment limit: past ``CAP`` the folded details give way to the JSON report.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bisect_tool.cause import one_line
from bisect_tool.kinds import find
from bisect_tool.report import causes
from bisect_tool.report import details as details_mod
from bisect_tool.report.environment import reported_warning, short_list
from bisect_tool.report.names import short_ref
from bisect_tool.report.text import cell, code, esc, plural, ref, table
from bisect_tool.values import percent, rate_text

#: GitHub refuses a comment over 65,536 characters; the margin leaves room for a line or two
CAP = 60_000
_CREDIBLE_SHOWN = 8  # credible-set commits listed inline in a one-liner before "and N more"
#: evidence rows kept when even the table alone would pass the cap
_ROWS_WHEN_CAPPED = 150


def _label(report: Mapping[str, Any]) -> str:
    a = report["answer"]
    return f"First {'good' if a['direction'] == 'fix' else 'bad'} {a.get('noun') or 'commit'}"


def _flip_words(c: Mapping[str, Any]) -> str:
    """The flip as the first line names it: linked, with its subject and PR for a commit."""
    out = ref(c)
    subject = c.get("subject") or ""
    if subject and c.get("name") == c.get("short"):  # a commit: a release's subject is noise
        out += f" {esc(subject)}"
        if c.get("pr_url"):
            out += f" ([#{c['pr']}]({c['pr_url']}))"
        elif c.get("pr"):
            out += f" (#{c['pr']})"
    if c.get("branch"):
        out += f", on `{esc(c['branch'])}`, not on the main line"
        if c.get("picked_from"):
            picked = code(short_ref(c["picked_from"]))
            out += (f": the cherry-pick of [{picked}]({c['picked_url']})" if c.get("picked_url")
                    else f": the cherry-pick of {picked}")
    return out


def _seen_sentence(report: Mapping[str, Any]) -> str:
    """What the lifetimes either side of the answer showed, and whether the controls held."""
    sure = report["how_sure"]
    near = sure.get("nearest_good")
    tested = {r["name"]: r for r in report["tested"]}
    bad_names = sure["bad_side"]["names"]
    parts = []
    if bad_names:
        b = tested[bad_names[-1] if report["answer"]["direction"] == "fix" else bad_names[0]]
        parts.append(f"{b['name']} showed the bug in {b['divergent']} of "
                     f"{plural(int(b['divergent']) + int(b['clean']), 'lifetime')}")
    if near:
        n = near["clean"] + near["divergent"]
        setting = (report["answer"].get("checks") or {}).get("clean_against_setting", "")
        parts.append(f"{near['name']} was clean in {near['clean']} of {n}"
                     f"{_rules_out(near['clean'], sure['asked'], setting)}" if not
                     near["divergent"] else f"{near['name']} in {near['divergent']} of {n}")
    if not parts:
        return ""
    controls = report.get("controls")
    held = ("the controls held" if controls and controls.get("ok") else
            "the controls did not hold" if controls else "no controls ran")
    return " " + "; ".join(parts) + f"; {held}."


def _rules_out(clean: int, asked: float, setting: str = "") -> str:
    """What ``clean`` clean lifetimes in a row rule out at the asked confidence: a bug there in
    r of the lifetimes or more, (1 - r)^clean = 1 - asked. A rarer one is not ruled out: a bug
    that a later commit made worse would be named at that commit (issue 38). ``setting``: the
    run's floor in words where it is not the default (``--clean-against 0.15``)."""
    if clean <= 0:
        return ""
    rate = 1 - (1 - asked) ** (1 / clean)
    held = f"; held to {setting}" if setting else ""
    return (f" (which rules out, at {asked:.0%}, a bug there in {rate:.0%} of lifetimes or "
            f"more; not a rarer one{held})")


def _answer_line(report: Mapping[str, Any]) -> list[str]:
    a = report["answer"]
    label = _label(report)
    block = a["flip_block"]
    conf = percent(a["confidence"])
    claim = f"**{conf}** that this is the {label.lower()} and both ends behave as given"
    if len(block) == 1:
        return [f"**{label}**: {_flip_words(block[0])} — {claim}.{_seen_sentence(report)}"]
    if block:
        noun = a.get("noun") or "commit"
        lines = [f"**{label}** could be any of these {len(block)} {noun}s (the ones between "
                 f"could not be tested) — **{conf}**:", ""]
        return lines + [f"- {_flip_words(c)}" for c in block]
    return [f"**{label}**: none found"]


def _state_lines(report: Mapping[str, Any]) -> list[str]:
    """For a search that ended without an answer: what happened, first, in one line."""
    a = report["answer"]
    state = a["state"]
    end_message = one_line(a.get("end_message") or "")
    reason = f": {esc(end_message)}" if end_message else ""
    credible = ", ".join(ref(c) for c in a["credible_set"][:_CREDIBLE_SHOWN]) or "empty"
    if state == "bad_end_never_reproduced":
        rng = report["range"]
        name = rng.get("bad_ref") or short_ref(rng["bad_sha"])
        return [f"**Nothing to bisect**: the bad end ({code(name)}) never showed the bug in "
                f"{a['bad_end_lifetimes']} lifetimes{reason}. Check the recipe reproduces it "
                "there (controls, co-residency, jitter) before bisecting."]
    if state == "ends_contradict":
        return [f"**An end is not what it was said to be**{reason}. No {a['noun']} is named."]
    if state == "good_side_shows_bug":
        return [f"**The bug shows on the good side of the flip too**{reason}. No {a['noun']} "
                "is named."]
    if state == "controls_failed":
        problem = (report.get("controls") or {}).get("problem") or "a control did not hold"
        return [f"**Controls failed**: {esc(problem.rstrip('.'))}. CLEAN results are not "
                f"trusted, so no {a['noun']} is named."]
    only = causes.only_cause(report.get("causes") or [], _ran(report))
    if only is not None and state in ("end_untestable", "no_candidate_left"):
        # every candidate tried stopped on one cause: not the ends' fault (issue 41)
        count = len(only["names"])
        what = (f"the pinned stack's gate refused their {code(only['gate']['file'] or '')}"
                if only.get("gate") else esc(only["cause"]))
        return [f"**Nothing could run**: {'all ' if count > 1 else ''}"
                f"{plural(count, 'candidate')} tried stopped on one cause, {what}, so no "
                f"{a['noun']} is named and other ends would not help. Next: "
                f"{esc(only['advice'])}."]
    if state == "end_untestable":
        return [f"**An end is untestable**{reason}."]
    words = {"budget_exhausted": "Inconclusive: budget exhausted",
             "no_candidate_left": "Inconclusive: no testable candidate left",
             "running": "Still running"}.get(state, f"Stopped ({esc(state)})")
    return [f"**{words}** after {a['evaluations']} lifetimes{reason}; the 90% credible set is "
            f"{credible}. Best guess so far:", "", *_answer_line(report)]


def _ran(report: Mapping[str, Any]) -> int:
    """How many candidates a lifetime (or run) said something of."""
    return sum(1 for r in report["tested"] if r["divergent"] or r["clean"])


def _how_sure_line(report: Mapping[str, Any]) -> str | None:
    s = report["how_sure"]
    if report["answer"]["state"] != "done" or s["confidence"] is None:
        return None
    if s["tiered"]:
        line = (f"{percent(s['lifetimes_alone'])} from the server lifetimes alone, "
                f"{percent(s['confidence'])} with the op check's narrowing")
    elif not find(report.get("probe_kind")).boots_server:
        line = f"{percent(s['confidence'])} from the probe's runs"
    else:
        line = percent(s["confidence"])
    below = s["confidence"] < s["stop_at"]
    line += (f" (below the {percent(s['stop_at'])} a run stops at today: this one stopped under an "
             "older rule)" if below else f" (the run stops at {percent(s['stop_at'])})")
    near, chance = s.get("nearest_good"), s.get("chance_clean_if_buggy")
    if near and chance is not None:
        line += (f"; were {near['name']} still buggy, "
                 f"{plural(near['clean'], 'clean lifetime')} would happen {percent(chance)} of the "
                 "time")
    return f"- How sure: {line}"


def _next_line(report: Mapping[str, Any]) -> str | None:
    step = (report.get("releases") or {}).get("next_step")
    if not step:
        return None
    paths = f" touching {', '.join(step['paths'])}" if step["paths"] else ""
    line = (f"- Next: the commits between {code(step['old'])} and {code(step['new'])}{paths}, "
            f"in a vLLM clone: {code(step['command'])}")
    if step.get("reaches_commits") is False:
        line += (" (its recipe's [artifacts] sources reach no commit without a release tag: "
                 "add \"wheel-index\" or \"source-build\")")
    return line


def _searched_line(report: Mapping[str, Any]) -> str:
    rng = report["range"]
    compare = f" ([compare]({rng['compare_url']}))" if rng.get("compare_url") else ""
    line = f"- Searched: {esc(report['headline']['searched'])}{compare}"
    r = report.get("releases") or {}
    if r.get("index_url"):
        line += f", as listed by {esc(r['index_url'])}"
    left = ", ".join(f"{esc(x['version'])} ({esc(x['why'])})" for x in r.get("left_out") or [])
    if left:
        line += f"; left out: {left}"
    prev = report.get("previous")
    if prev:
        line += (f"; narrowed first over {prev.get('candidates')} releases to "
                 f"{code(prev.get('flip_label'))} ({percent(prev.get('confidence'))})")
    return line


def _differs_line(report: Mapping[str, Any]) -> str | None:
    diff = report.get("differences")
    known, unknown = short_list(diff)
    if not diff or not (known or unknown):
        return None
    line = f"- Not as reported in {esc(diff['issue'])}: {', '.join(known) or 'nothing known'}"
    if unknown:
        line += f"; not recorded or not checked by this run: {', '.join(unknown)}"
    return line + " (see Environment)"


def _top(report: Mapping[str, Any]) -> list[str]:
    a = report["answer"]
    words = report["headline"].get("words")
    # the words are the report's own (names, file names in code spans): not escaped
    title = f"## Bisect result: {words}" if words else "## Bisect result"
    lines: list[str] = [title, ""]
    lines += _answer_line(report) if a["state"] == "done" else _state_lines(report)
    probe = (f"- Probe: `--run` {code(report['run_command'])} (exit codes as git bisect run)"
             if report.get("run_command") else None)  # a recipe's probe is in the words above
    bullets = [_searched_line(report), probe, _how_sure_line(report), _next_line(report),
               _differs_line(report)]
    return [*lines, "", *(b for b in bullets if b), "",
            *reported_warning(report.get("differences"))]


def _rate(name: str, what: str, rate: Mapping[str, Any], prior: str, behind: str) -> list[str]:
    if not rate["measured"] or rate["median"] is None:
        return [f"{name}: {what}", f"its prior alone, {prior}: {behind}"]
    lo, hi = rate["interval"]
    return [f"{name}: {what}",
            f"{rate_text(rate['median'])} [{rate_text(lo)}, {rate_text(hi)}] "
            "(median [90% interval]), "
            f"from {behind} and the prior {prior}"]


def _how_sure_section(report: Mapping[str, Any]) -> list[str]:
    s = report["how_sure"]
    if s["confidence"] is None:
        return []
    pr = s["priors"]
    rows: list[list[str]] = []
    if s["tiered"]:
        rows.append(["From the server lifetimes alone", percent(s["lifetimes_alone"])])
        rows.append([
            "With the op check's narrowing",
            f"{percent(s['confidence'])}: the lifetimes scored with a prior that the op check "
            f"flips where they do ({percent(s['stand_in_prior'])} before them, "
            f"{percent(s['stand_in_probability'])} after)"])
    else:
        what = ("server lifetimes" if find(report.get("probe_kind")).boots_server
                else "probe's runs")
        rows.append([f"From the {what}", percent(s["confidence"])])
    rows.append(["The run stops at", f"{percent(s['stop_at'])} (asked {percent(s['asked'])})"])
    near, chance = s.get("nearest_good"), s.get("chance_clean_if_buggy")
    bad = s["bad_side"]
    if near and chance is not None:
        rows.append([
            f"Were {near['name']} still buggy: {plural(near['clean'], 'clean lifetime')}",
            f"{percent(chance)} of the time, with p from the bad side's {bad['divergent']} of "
            f"{bad['lifetimes']} divergent (prior: {percent(pr['p_point_mass'])} that p = 1, else "
            f"Beta({pr['p_alpha']:g}, {pr['p_beta']:g}))"])
    good = s["good_side"]
    rows.append(_rate("p", "a lifetime with the bug shows it", s["p"],
                      f"{percent(pr['p_point_mass'])} p = 1, else Beta({pr['p_alpha']:g}, "
                      f"{pr['p_beta']:g})",
                      f"{bad['divergent']} of {plural(bad['lifetimes'], 'lifetime')} on the "
                      "bad side" if bad["lifetimes"] else "no lifetime on the bad side"))
    rows.append(_rate("q", "a lifetime without the bug shows it anyway", s["q"],
                      f"Beta({pr['q_alpha']:g}, {pr['q_beta']:g})",
                      f"{good['divergent']} of {plural(good['lifetimes'], 'lifetime')} on the "
                      "good side" if good["lifetimes"] else "no lifetime on the good side"))
    rows.append(["The flip lies beyond the good end", percent(s["good_end_doubt"])])
    rows.append(["The bad end does not show the bug", percent(s["bad_end_doubt"])])
    rows += _check_rows(report["answer"].get("checks"))
    return ["### How sure", "", *table(["", ""], [[esc(a), esc(b)] for a, b in rows]), ""]


def _check_rows(checks: Mapping[str, Any] | None) -> list[list[str]]:
    """What the checks of the model saw at the end (issue 38): a good end that shows the bug
    after all, and a good side of the flip that shows it at a rate of its own."""
    if not checks:
        return []
    seen = ", ".join(f"{d['name']} in {d['divergent']} of {d['lifetimes']}"
                     for d in checks["good_side_diverged"]) or "none"
    rate = percent(checks["clean_against_rate"])
    if checks.get("clean_against_setting"):
        rate += f" ({checks['clean_against_setting']})"
    return [["The good end shows the bug after all (at the bad side's rate or one of its own)",
             percent(checks["good_end_not_good"])],
            [f"The good side of the flip shows it at a rate of its own (divergent there: {seen})",
             percent(checks["good_side_doubt"])],
            *([f"Were {c['name']} buggy at rate {rate}: {plural(c['clean'], 'clean lifetime')}",
               f"{percent(c['chance'])} of the time"] for c in checks["clean"])]


def _evidence_section(report: Mapping[str, Any], max_rows: int | None) -> list[str]:
    lines = ["### Evidence", ""]
    sym = report.get("symptom")
    if sym:
        seen = esc(sym["seen"]) if sym.get("seen") else "not reproduced here"
        lines += [f"Reported: {esc(sym['reported'])}. Seen here: {seen}.", ""]
    if not (report["lifetimes"] or report["untestable"]):
        return [*lines, "No lifetime ran.", ""]
    lines += details_mod.evidence_table(report, max_rows)
    notes = details_mod.evidence_notes(report)
    return [*lines, *([""] + notes if notes else []), ""]


def _controls_section(report: Mapping[str, Any]) -> list[str]:
    c = report.get("controls")
    lines = ["### Controls", ""]
    if c is None:
        return [*lines, "Not run: a CLEAN lifetime is unverified evidence.", ""]
    python = f" under {c['python_side']}'s Python" if c.get("python_side") else ""
    other = ", ".join(f"{k}={v}" for k, v in c["other_env"].items())
    where = (f"Run on {code(c['candidate'])}{python}, "
             + ("in one lifetime " if c["one_lifetime"] else "")
             + f"booted with {code(c['switch'] + '=0')}"
             + (f" (and {code(other)}, as every lifetime)" if other else "")
             + (f"; {plural(int(c['attempts']), 'attempt')}" if c.get("attempts") else "") + ":")
    lines += [where, ""]
    w = c["workload"]
    lines.append(f"- Positive: the concurrent workload ({w['requests']} requests + "
                 f"{w['fillers']} fillers) with batch invariance off: "
                 f"**{c['positive']['verdict']}**{details_mod.seen_words(c['positive'])}")
    lines.append(f"- Negative: the same requests one at a time: "
                 f"**{c['negative']['verdict']}**{details_mod.seen_words(c['negative'])}")
    for finding in c.get("suspects") or []:
        lines.append(f"- Suspect, with batch invariance as every lifetime had it: {esc(finding)}")
    for r in c.get("refused") or []:
        lines.append(f"- {code(r['candidate'])} could not run them: {esc(r['why'])}")
    if not c["positive_diverged"]:
        lines += ["", "> [!WARNING]", "> The positive control did not diverge: the probe was not "
                  "shown able to see the bug on this stack, so CLEAN lifetimes prove nothing."]
    return [*lines, ""]


def _prs_section(report: Mapping[str, Any]) -> list[str]:
    prs = report["prs"]
    if not prs["items"]:
        return []
    what = ("Pull requests in the range that touch the compiled sources "
            f"({', '.join(code(p) for p in report['range']['paths'])})"
            if prs["filtered_by_paths"] else "Pull requests in the range")
    lines = ["### Changes in the range", "", f"{what}:", ""]
    for item in prs["items"]:
        number = f"[#{item['pr']}]({item['url']})" if item.get("url") else f"#{item['pr']}"
        lines.append(f"- {number} {esc(item['subject'])} ({code(item['short'])})")
    if prs["more"]:
        lines.append(f"- and {prs['more']} more")
    return [*lines, ""]


def _environment_section(report: Mapping[str, Any]) -> list[str]:
    rows = report.get("environment_block") or []
    lines = ["### Environment", ""]
    if rows:
        lines += [*table(["What", "Value"], [[esc(k), esc(v)] for k, v in rows]), ""]
    else:
        lines += ["Not recorded by this run.", ""]
    diff = report.get("differences")
    if diff and diff["rows"]:
        lines += [f"Differences from the setup reported in {esc(diff['issue'])}:", ""]
        lines += table(["What", "Reported", "This run"],
                       [[w if w.startswith("`") else esc(w), cell(a), cell(b)]
                        for w, a, b in diff["rows"]])
        if diff.get("workload"):
            lines += ["", f"Reported workload: {esc(diff['workload'])}."]
        lines.append("")
    return lines


def _render(report: Mapping[str, Any], plot: Path | str | None, *, full: bool,
            max_rows: int | None = None) -> str:
    lines = _top(report)
    if report["answer"]["state"] == "done":
        lines += _how_sure_section(report)
    lines += _evidence_section(report, max_rows)
    lines += _controls_section(report)
    if report.get("tiers"):
        lines += details_mod.narrowing_section(report)
    lines += _prs_section(report)
    lines += _environment_section(report)
    lines += details_mod.closing(report, plot, full=full)
    return "\n".join(lines).rstrip() + "\n"


def render_markdown(report: Mapping[str, Any], *, plot: Path | str | None = None) -> str:
    """The report for an issue (see the module's docstring). ``plot`` (or ``report["plot"]``):
    the posterior PNG as the report links it (a path relative to the report); without one a
    text plot, and neither below ``PLOT_MIN_CANDIDATES`` candidates.

    Under ``CAP`` characters: past it the folded details give way to a pointer to the JSON
    report (which holds everything), and past it still the evidence keeps its first rows."""
    plot = plot if plot is not None else report.get("plot")
    text = _render(report, plot, full=True)
    if len(text) <= CAP:
        return text
    text = _render(report, plot, full=False)
    if len(text) <= CAP:
        return text
    return _render(report, plot, full=False, max_rows=_ROWS_WHEN_CAPPED)


__all__ = ["CAP", "render_markdown"]

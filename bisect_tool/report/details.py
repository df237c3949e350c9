"""The report's tables and its one folded ending: the evidence table and its notes, the op
check's section, and the closing ``<details>`` (how to reproduce, every lifetime in one table,
the gate's verdicts whole, the posterior). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from bisect_tool.probes.metrics import StepBucket
from bisect_tool.probes.render import render_op_detail
from bisect_tool.report.plot import text_plot
from bisect_tool.report.text import cell, code, delta, details, esc, fence, plural, ref, table
from bisect_tool.values import percent

_DAGGER = "†"


def lifetime_order(lt: Mapping[str, Any]) -> tuple[int, int, int]:
    """A candidate's lifetimes by number (#0, #1, ...), not in the order parallel ones ended."""
    number = str(lt.get("number") or "").lstrip("#")
    return (int(lt["index"]), int(number) if number.isdigit() else 1 << 30,
            int(lt.get("seq") or 0))


def _pairs(n: int, repeats: Any) -> str:
    """Repeat pairs that differ, summarised: "all 10 pairs", "3 of 10 pairs"."""
    if not isinstance(repeats, int) or repeats < 2:
        return f"{n} pairs"
    total = repeats * (repeats - 1) // 2
    return f"all {total} repeat pairs" if n == total else f"{n} of {total} repeat pairs"


def seen_words(side: Mapping[str, Any]) -> str:
    """A control's outcome in the evidence table's words."""
    if side["verdict"] == "UNTESTABLE":
        return f": could not run ({esc(side['message'])})" if side.get("message") else ""
    bits = []
    if side.get("distinct_outputs") == 1 and side.get("repeats"):
        bits.append(f"{side['repeats']} repeats bitwise identical")
    elif side.get("distinct_outputs") and side.get("repeats"):
        bits.append(f"{side['distinct_outputs']} distinct outputs in {side['repeats']} repeats")
    if side.get("pairs"):
        bits.append(f"{_pairs(int(side['pairs']), side.get('repeats'))} differ")
    if side.get("coresidency") is not None:
        bits.append(f"co-residency {side['coresidency']}")
    if side.get("first_token_difference") is not None:
        bits.append(f"tokens first differ at position {side['first_token_difference']}")
    return (", " + ", ".join(bits)) if bits else ""


def evidence_table(report: Mapping[str, Any], max_rows: int | None = None) -> list[str]:
    """Every lifetime, one row, grouped by candidate; the candidate's verdict on its first row.
    The logprob delta only up to the first differing token; an older journal's delta over the
    later positions is left out (``†``, see the notes)."""
    op = report.get("probe_kind") == "op"
    head = ["Candidate", "Lifetime", "Verdict", "Co-residency reached / target",
            "Distinct outputs / repeats",
            "Max abs diff between launch sizes" if op else
            "Max \\|Δ logprob\\| up to the first differing token",
            "First position that differs", "First token that differs", "What moved"]
    tested = {r["index"]: r for r in report["tested"]}
    seen: set[int] = set()
    rows: list[list[str]] = []
    # grouped by candidate (range order), each one's lifetimes in journal order: lifetimes that
    # ran in parallel interleave in the journal
    ordered = sorted(report["lifetimes"], key=lifetime_order)
    for lt in ordered:
        r = tested.get(lt["index"])
        if r is None:
            continue
        who = "″"
        if lt["index"] not in seen:
            seen.add(lt["index"])
            role = f"{r['role']}, " if r["role"] else ""
            who = f"{ref(r)} ({role}{r['verdict']})"
        cores = "-" if lt["coresidency"] is None else (
            f"{lt['coresidency']} / {lt['target']}" if lt.get("target") else str(lt["coresidency"]))
        distinct = "-" if lt["distinct_outputs"] is None else (
            f"{lt['distinct_outputs']} / {lt['repeats']}" if lt.get("repeats")
            else str(lt["distinct_outputs"]))
        size = delta(lt["max_abs_delta"]) if lt.get("delta_after_divergence") is None else (
            f"-{_DAGGER}")
        rows.append([who, code(lt["number"]), f"**{lt['verdict']}**", cores, distinct, size,
                     cell(lt.get("first_difference")), cell(lt.get("first_token_difference")),
                     cell(lt.get("moved"))])
    for u in report["untestable"]:
        if not u.get("lifetimes"):  # those with lifetimes have their rows above
            rows.append([code(u["name"]), "-", "**UNTESTABLE**", *["-"] * 6])
    shown = rows if max_rows is None else rows[:max_rows]
    out = table(head, shown)
    if len(shown) < len(rows):
        out += ["", f"and {len(rows) - len(shown)} more lifetimes: every one is in the JSON "
                "report (`bisect report --format json`)."]
    return out


def evidence_notes(report: Mapping[str, Any]) -> list[str]:
    """Why candidates and lifetimes could not run (one line each, with the log to read), and
    what a ``†`` in the delta column means."""
    notes = []
    listed = set()
    for u in report["untestable"]:
        listed.add(u["sha"])
        where = f" (the whole log: `logs/{u['log']}.log` in the state dir)" if u.get("log") else ""
        notes.append(f"- {code(u['name'])} could not run: "
                     f"{esc(u['message'] or 'no reason recorded')}{where}")
    for lt in report["lifetimes"]:
        if lt["verdict"] == "UNTESTABLE" and lt["sha"] not in listed:
            where = (f" (the whole log: `logs/{lt['lifetime_id']}.log` in the state dir)"
                     if lt.get("has_log") else "")
            notes.append(f"- {code(lt['name'])} {lt['number']} could not run: "
                         f"{esc(lt['cause'] or 'no reason recorded')}{where}")
    late = [lt for lt in report["lifetimes"] if lt.get("delta_after_divergence") is not None]
    if late:
        which = ", ".join(f"{lt['name']} {lt['number']}: {delta(lt['delta_after_divergence'])}"
                          for lt in late)
        notes.append(f"- {_DAGGER} The tokens moved in this lifetime, and the run recorded its "
                     f"logprob delta over the positions after they diverged too ({which}), where "
                     "the two outputs follow different tokens: not a like-for-like difference, "
                     "so it is left out. The probe now stops comparing at the first differing "
                     "token.")
    return notes


#: rejected ops named in the op check's table cell; a longer list follows the table whole (0.22.0
#: under 0.26.0's stack lacks 56 ops: a 2,700-character cell on the H100, 2026-12-07)
_OPS_IN_CELL = 4


def _gate_words(g: Mapping[str, Any], limit: int | None = None) -> str:
    named = list(g["ops"])
    shown = named if limit is None or len(named) <= limit else named[:limit]
    ops = ", ".join(code(o) for o in shown) or "its extension"
    if len(shown) < len(named):
        ops += f" and {len(named) - len(shown)} more (every one under the table)"
    if g["unnamed"]:
        ops += f" and {g['unnamed']} more this run did not name"
    return ops


def narrowing_section(report: Mapping[str, Any]) -> list[str]:
    """The op check's narrowing, as one section: what it ran, what it saw per candidate and
    what the pinned stack's gate said of each, where it put the flip and what ran after."""
    t = report["tiers"]
    noun = report["answer"].get("noun") or "commit"
    files = ", ".join(code(PurePosixPath(f).name) for f in t["gate_files"]) or "extension"
    lines = ["### The op check", ""]
    story = (f"Before any server lifetime, the op check ran on each candidate's {files} "
             f"({esc(t['what_ran'])}): {plural(int(t['runs'] or 0), 'run')} on "
             f"{plural(int(t['candidates']), noun)} put the flip at {code(t['flip'])} "
             f"({percent(t['confidence'])}).")
    sides = t.get("sides")
    if sides:
        b, g = sides["bad"], sides["good"]
        def ran(x: Mapping[str, Any]) -> str:
            if not x["lifetimes"]:
                return "could not run"
            return f"{x['divergent']} of {plural(x['lifetimes'], 'lifetime')} divergent"

        story += (f" Server lifetimes then ran either side of it: {code(b['name'])} ({ran(b)}) "
                  f"and {code(g['name'])} ({ran(g)}).")
    if t.get("fell_back"):
        story += f" Then server lifetimes searched the whole range: {esc(t['fell_back'])}."
    elif t.get("phase") == "narrow":
        story += " (still narrowing)"
    lines += [story, ""]
    python = report["controls"]["python_side"] if report.get("controls") else None
    pinned = f"The pinned stack ({python}'s Python)" if python else "The pinned stack"
    rows = []
    long_lists = []
    for r in t["rows"]:
        gate = r["gate"]
        said = "-" if gate is None else "loads it" if gate == "ok" else (
            f"rejects it: {_gate_words(gate, _OPS_IN_CELL)}")
        rows.append([ref(r), str(r["runs"]), r["verdict"], esc(r["saw"]), said])
        if isinstance(gate, Mapping) and len(gate["ops"]) > _OPS_IN_CELL:
            long_lists.append(f"- {ref(r)}: {_gate_words(gate)}.")
    lines += table([noun.capitalize(), "Runs", "Op check", "What it saw", pinned], rows, "lrll")
    if long_lists:
        lines += ["", "Every op the gate found amiss:", "", *long_lists]
    compared = t.get("gate_compared")
    what = (f"the ops in `[runtime] gate_ops` ({', '.join(code(o) for o in compared)})"
            if compared else f"every op the pinned {files} registers")
    lines += ["", f"The pinned stack's gate compared {what}."]
    rejected = t.get("gate_rejected") or []
    if rejected:
        lines[-1] += (" Server lifetimes cannot run the " + noun + "s it rejects; the op check "
                      "can (it loads the file into PyTorch alone).")
    return [*lines, ""]


def run_and_recipe(what: str, r: Mapping[str, Any]) -> list[str]:
    """The command that ran (``what``: "The bisect", "The locate") and how its recipe file
    differs from the bundled one, values naming the run's own folders left out."""
    lines: list[str] = []
    if r.get("command"):
        lines += [f"{what}:", "", fence(r["command"], "sh"), ""]
    if r.get("changes"):
        by_section: dict[str, list[str]] = {}
        for section, line in r["changes"]:
            by_section.setdefault(section, []).append(line)
        toml = "\n\n".join(f"[{sec}]\n" + "\n".join(ls) for sec, ls in by_section.items())
        lines += [f"{code(r['recipe_file'])} is the bundled recipe {code(r['recipe_name'])} "
                  "with these values changed:", "", fence(toml, "toml"), ""]
    if r.get("left_out"):
        lines += [f"Left out, as they name the run's own folders: "
                  f"{', '.join(code(k) for k in r['left_out'])}.", ""]
    return lines


def _reproduce(report: Mapping[str, Any]) -> list[str]:
    r = report["reproduce"]
    lines = ["#### Reproduce", ""]
    lines += run_and_recipe("The bisect", r)
    w = r.get("weights")
    if w:
        made = (f"this run's was made with transformers {w['transformers']} and torch "
                f"{w['torch']}" if w.get("transformers") else
                "this run did not record the transformers and torch that made its checkpoint; "
                "the same versions give the same weights")
        lines += [f"The weights: a random checkpoint shaped by the bundled {code(w['config'])}, "
                  f"not the published ones ({made}):", "", fence(w["command"], "sh"), ""]
    pinned = r.get("pinned")
    if r.get("swap") and pinned:
        package, version = pinned["package"], pinned["version"]
        site = (f"SITE=$(python -c 'import importlib.util, os; print(os.path.dirname(os.path."
                f"dirname(importlib.util.find_spec(\"{package}\").origin)))')")
        body = [f"pip install {package}=={version}", site]
        for s in r["swap"]:
            seen = f" (here it {s['seen']})" if s["seen"] == "showed the bug" else (
                " (here it was clean)" if s["seen"] else "")
            body += [f"# {s['name']}{seen}: its file into the pinned install, then one lifetime "
                     "(below)", *s["lines"]]
        lines += [f"The pinned Python side ({pinned['name']}), and each end's compiled file "
                  "swapped into it as a lifetime does:", "", fence("\n".join(body), "sh"), ""]
    one = r.get("lifetime")
    if one:
        lines += ["One lifetime by hand (the server as a lifetime starts it, then the probe "
                  "against it):", "", fence(f"{one['server']}\n{one['client']}", "sh"), ""]
    return lines


def _steps(value: Any) -> str:
    bucket = StepBucket.from_detail(value)
    return "-" if bucket is None else bucket.label()


def _lifetimes_table(report: Mapping[str, Any]) -> list[str]:
    """Every server lifetime in one table (what the evidence table does not show)."""
    rows = []
    for lt in sorted(report["lifetimes"], key=lifetime_order):
        d = lt["detail"]
        took = lt.get("duration_s")
        per = d.get("coresidency_per_repeat")
        steps = d.get("step_tokens_per_repeat")
        pairs = d.get("differing_pairs")
        rows.append([
            f"{code(lt['name'])} {lt['number']}",
            "-" if not isinstance(took, int | float) else f"{took:.0f} s",
            cell(d.get("mode")),
            "-" if pairs is None else ("none" if not pairs else _pairs(len(pairs),
                                                                        d.get("repeats"))),
            cell(d.get("diverging_observations")),
            "-" if per is None else ", ".join(str(p) for p in per),
            "-" if not steps else ", ".join(_steps(s) for s in steps),
            cell(d.get("redone_repeats")),
        ])
    return table(["Lifetime", "Took", "Mode", "Repeat pairs that differ",
                  "Diverging (request, pair)", "Co-residency per repeat",
                  "Largest engine step per repeat (tokens)", "Repeats redone"], rows)


def _each_lifetime(report: Mapping[str, Any]) -> list[str]:
    kind = report.get("probe_kind")
    lines = ["#### Every lifetime", ""]
    others = report["lifetimes"]
    if kind == "server":
        lines += [*_lifetimes_table(report), ""]
        # lifetimes of another probe in a server run's journal (none in a real run): as text
        others = [lt for lt in others if "mode" not in lt["detail"] and lt["log_tail"]]
    for lt in others:
        lines += [f"**{code(lt['name'])} {lt['number']}**: {lt['verdict']}"]
        if lt["message"]:
            lines += ["", esc(lt["cause"] or lt["message"])]
        if lt["detail"].get("groups") is not None:
            lines += ["", render_op_detail(lt["detail"])]
        if lt["log_tail"]:
            lines += ["", "Output:", "", fence(lt["log_tail"], "text")]
        lines.append("")
    return lines


def _gates(report: Mapping[str, Any]) -> list[str]:
    rejected = (report.get("tiers") or {}).get("gate_rejected") or []
    if not rejected:
        return []
    text = "\n".join(f"{g['name']}: {g['message']}" for g in rejected)
    return ["#### The gate's verdicts, whole", "", fence(text, "text"), ""]


def version_words(report: Mapping[str, Any]) -> str:
    """The tool that ran, by version ("0+unknown": a source tree before the version was read
    from pyproject.toml; said so, not printed as a version)."""
    version = str(report.get("tool_version") or "")
    if not version or version == "0+unknown":
        return "bisect, version not recorded"
    return f"bisect {esc(version)}"


def closing(report: Mapping[str, Any], plot: Path | str | None, *, full: bool) -> list[str]:
    """The one folded block the report ends with: how to reproduce, then (space allowing)
    every lifetime, the gate's verdicts whole and the posterior."""
    body = _reproduce(report)
    if full:
        body += _each_lifetime(report) + _gates(report)
        if report.get("show_plot"):
            shown = (f"![posterior over the range]({PurePosixPath(Path(plot)).as_posix()})"
                     if plot else fence(text_plot(report), "text"))
            body += ["#### Posterior over the range", "", shown, ""]
    else:
        body += ["Every lifetime in detail is in the JSON report (`bisect report --format json`;"
                 " attach it): this report leaves it out to stay under GitHub's 65,536 "
                 "characters.", ""]
    body.append(f"<sub>session {esc(report.get('session') or '?')}</sub>")
    summary = (f"Reproduce{', and every lifetime in detail' if full else ''} "
               f"({version_words(report)})")
    return details(summary, body)


__all__ = ["closing", "evidence_notes", "evidence_table", "narrowing_section"]

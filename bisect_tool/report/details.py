"""The report's tables and its one folded ending: the evidence table and its notes, the op
check's section, and the closing ``<details>`` (how to reproduce, every lifetime in one table,
the gate's verdicts whole, the posterior). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from bisect_tool.kinds import find
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


#: where the gate's verdicts are whole: the last part of the report's folded ending
_WHOLE = 'in "The gate\'s verdicts, whole" at the end'
#: candidates named in one row or note before "and N more"
_NAMES_SHOWN = 3


def _ran(r: Mapping[str, Any]) -> bool:
    """A candidate some lifetime ran on (clean, divergent or inconclusive), not only refused."""
    return bool(r["divergent"] or r["clean"] or r["inconclusive"])


def _moved_over(lifetimes: list[Mapping[str, Any]]) -> str:
    moved = {str(lt.get("moved")) for lt in lifetimes if lt.get("moved")}
    return next((m for m in ("tokens", "logprobs only", "nothing") if m in moved), "-")


def evidence_table(report: Mapping[str, Any], max_rows: int | None = None) -> list[str]:
    """One row per candidate, those that ran first (in range order) and those that could not
    run after them; then every lifetime, one row each, folded, grouped the same way (issue 41:
    36 lifetime rows in the demo's report, 11 UNTESTABLE rows before any result in a GPU one).
    The logprob delta only up to the first differing token; an older journal's delta over the
    later positions is left out (``†``, see the notes)."""
    kind = find(report.get("probe_kind"))
    size_head = kind.size_head
    tested = list(report["tested"])
    order = [r for r in tested if _ran(r)] + [r for r in tested if not _ran(r)]
    by_index: dict[int, list[Mapping[str, Any]]] = {}
    for lt in sorted(report["lifetimes"], key=lifetime_order):
        by_index.setdefault(int(lt["index"]), []).append(lt)
    run = not kind.detail_columns  # a command's exit status: nothing but the verdict
    width = 3 if run else 7
    summary = []
    others = [r for r in order if not _ran(r) and not r["role"]]
    for r in order:
        role = f" ({r['role']})" if r["role"] else ""
        if not _ran(r):
            if r["role"]:
                summary.append([f"{ref(r)}{role}", "**UNTESTABLE**", *["-"] * (width - 2)])
            elif r is others[0]:  # the others that could not run: one row, their causes below
                first = ", ".join(ref(x) for x in others[:_NAMES_SHOWN])
                more = f" and {len(others) - _NAMES_SHOWN} more" if len(
                    others) > _NAMES_SHOWN else ""
                who = first + more
                summary.append([who + (f" ({len(others)} candidates)" if len(others) > 1 else ""),
                                "**UNTESTABLE**", *["-"] * (width - 2)])
            continue
        conclusive = int(r["divergent"]) + int(r["clean"])
        target = r.get("target_coresidency")
        cores = "-" if r.get("max_coresidency") is None else (
            f"{r['max_coresidency']} / {target}" if target else str(r["max_coresidency"]))
        distinct = "-" if r.get("distinct_outputs") is None else (
            f"{r['distinct_outputs']} / {r['repeats']}" if r.get("repeats")
            else str(r["distinct_outputs"]))
        lifetimes = f"{r['divergent']} of {conclusive}" + (
            f" (+{r['inconclusive']} inconclusive)" if r["inconclusive"] else "")
        summary.append([f"{ref(r)}{role}", f"**{r['verdict']}**", lifetimes, cores, distinct,
                        delta(r.get("max_abs_delta")),
                        _moved_over(by_index.get(int(r["index"]), []))][:width])
    for u in report["untestable"]:  # refused before any lifetime: no row of its own above
        if u["index"] not in {int(r["index"]) for r in tested}:
            summary.append([code(u["name"]), "**UNTESTABLE**", *["-"] * (width - 2)])
    out = table(["Candidate", "Verdict", f"{kind.noun.capitalize()}s that showed it",
                 "Co-residency reached / target", "Distinct outputs / repeats (most)", size_head,
                 "What moved"][:width], summary)
    rows: list[list[str]] = []
    for r in order:
        for i, lt in enumerate(by_index.get(int(r["index"]), [])):
            cores = "-" if lt["coresidency"] is None else (
                f"{lt['coresidency']} / {lt['target']}" if lt.get("target")
                else str(lt["coresidency"]))
            distinct = "-" if lt["distinct_outputs"] is None else (
                f"{lt['distinct_outputs']} / {lt['repeats']}" if lt.get("repeats")
                else str(lt["distinct_outputs"]))
            size = delta(lt["max_abs_delta"]) if lt.get("delta_after_divergence") is None else (
                f"-{_DAGGER}")
            rows.append([ref(r) if i == 0 else "″", code(lt["number"]), f"**{lt['verdict']}**",
                         cores, distinct, size, cell(lt.get("first_difference")),
                         cell(lt.get("first_token_difference")), cell(lt.get("moved"))][
                             :3 if run else None])
    if not rows:
        return out
    shown = rows if max_rows is None else rows[:max_rows]
    each = table(["Candidate", "Run" if run else "Lifetime", "Verdict",
                  "Co-residency reached / target", "Distinct outputs / repeats", size_head,
                  "First position that differs", "First token that differs", "What moved"][
                      :3 if run else None], shown)
    if len(shown) < len(rows):
        each += ["", f"and {len(rows) - len(shown)} more lifetimes: every one is in the JSON "
                 "report (`bisect report --format json`)."]
    noun = kind.noun
    ran = sum(1 for r in order if by_index.get(int(r["index"])))
    return [*out, "", *details(f"Each {noun} ({plural(len(rows), noun)} of "
                                f"{plural(ran, 'candidate')}, grouped the same way)", each)]


def _names(names: list[str]) -> str:
    shown = ", ".join(code(n) for n in names[:_NAMES_SHOWN])
    return shown + (f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN
                    else "")


def evidence_notes(report: Mapping[str, Any]) -> list[str]:
    """Why candidates and lifetimes could not run, one line a cause with how many it stopped
    (issue 41: one cause listed 115 times), the gate's refusals with the ops they name (four,
    then the count: every one is in the folded verdicts) and which ops the gate compared, and
    what a ``†`` in the delta column means."""
    notes = []
    refused = False
    for group in report.get("causes") or []:
        names = group["names"]
        count = f"{len(names)} candidates ({_names(names)})" if len(names) > 1 else code(names[0])
        gate = group.get("gate")
        if gate:
            refused = True
            notes.append(f"- {count} could not run: the pinned stack's gate refused "
                         f"{'their' if len(names) > 1 else 'its'} {code(gate['file'] or '')}: "
                         f"{_gate_words(gate, _OPS_IN_CELL, _WHOLE)}.")
            continue
        log = group.get("log")
        where = f" (the whole log: `logs/{log}.log` in the state dir)" if log else ""
        notes.append(f"- {count} could not run: {esc(group['cause'])}{where}")
    listed = {u["sha"] for u in report["untestable"]}
    for lt in report["lifetimes"]:
        if lt["verdict"] == "UNTESTABLE" and lt["sha"] not in listed:
            where = (f" (the whole log: `logs/{lt['lifetime_id']}.log` in the state dir)"
                     if lt.get("has_log") else "")
            notes.append(f"- {code(lt['name'])} {lt['number']} could not run: "
                         f"{esc(lt['cause'] or 'no reason recorded')}{where}")
    if refused and not report.get("tiers"):  # the op check's section says it otherwise
        notes.append(f"- {gate_compared(report)}")
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


def gate_compared(report: Mapping[str, Any]) -> str:
    """Which ops the pinned stack's gate compared: the recipe's ``gate_ops``, else every op
    the pinned file registers."""
    recipe = report.get("recipe") or {}
    compared = recipe.get("gate_ops")
    files = ", ".join(code(PurePosixPath(f).name) for f in recipe.get("swap_set") or []) or (
        "extension")
    what = (f"the ops in `[runtime] gate_ops` ({', '.join(code(o) for o in compared)})"
            if compared else f"every op the pinned {files} registers")
    return f"The pinned stack's gate compared {what}."


#: rejected ops named in the op check's table cell; a longer list follows the table whole (0.22.0
#: under 0.26.0's stack lacks 56 ops: a 2,700-character cell on the H100, 2026-12-07)
_OPS_IN_CELL = 4


def _gate_words(g: Mapping[str, Any], limit: int | None = None,
                where: str = "under the table") -> str:
    """The ops a gate's refusal names, whole (never cut mid-name): at most ``limit``, then how
    many more and ``where`` every one is."""
    named = list(g["ops"])
    shown = named if limit is None or len(named) <= limit else named[:limit]
    ops = ", ".join(code(o) for o in shown) or "its extension"
    if len(shown) < len(named):
        ops += f" and {len(named) - len(shown)} more (every one {where})"
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


def tool_source(report: Mapping[str, Any]) -> str:
    """Where to get the bisect that ran: the commit its version names (``0.1.0+g16fe12e``), or
    the version alone where it names none."""
    version = str(report.get("tool_version") or "")
    base, _, local = version.partition("+g")
    if local:
        return (f"The tool: bisect {esc(version)}, the `bisect-tool` package at commit "
                f"{code(local)} of its repository (in a clone of it: `git checkout {local} && "
                "pip install .`).")
    if version and version != "0+unknown":
        return (f"The tool: bisect {esc(version)} (`bisect-tool` {esc(base)}; this run recorded "
                "no commit of it).")
    return "The tool: this run did not record its bisect's version."


def _reproduce(report: Mapping[str, Any]) -> list[str]:
    r = report["reproduce"]
    lines = ["#### Reproduce", "", tool_source(report), ""]
    lines += run_and_recipe("The bisect", r)
    w = r.get("weights")
    if w:
        made = (f"this run's was made with transformers {w['transformers']} and torch "
                f"{w['torch']}" if w.get("transformers") else
                "this run did not record the transformers and torch that made its checkpoint; "
                "the same versions give the same weights")
        check = [f'echo "{digest}  {w["dir"]}/{name}" | sha256sum -c'
                 for name, digest in sorted((w.get("files") or {}).items())]
        lines += [f"The weights: a random checkpoint shaped by the bundled {code(w['config'])}, "
                  f"not the published ones ({made}"
                  + ("; the sha256 of this run's checkpoint checks the one made again" if check
                     else "; this run did not record its checkpoint's sha256") + "):", "",
                  fence("\n".join([w["command"], *check]), "sh"), ""]
    pinned = r.get("pinned")
    if r.get("swap") and pinned:
        body = list(pinned.get("stack") or [])
        for s in r["swap"]:
            seen = f" (here it {s['seen']})" if s["seen"] == "showed the bug" else (
                " (here it was clean)" if s["seen"] else "")
            body += [f"# {s['name']}{seen}: its file into the pinned install, then one lifetime "
                     "(below)", *s["lines"]]
        lines += [f"The pinned stack as this run had it ({pinned['name']}'s Python side with the "
                  "versions it recorded), and each end's compiled file swapped into it as a "
                  "lifetime does:", "", fence("\n".join(body), "sh"), ""]
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
    kind = find(report.get("probe_kind"))
    lines = ["#### Every lifetime", ""]
    others = report["lifetimes"]
    if kind.boots_server:
        lines += [*_lifetimes_table(report), ""]
        # lifetimes of another probe in a server run's journal (none in a real run): as text
        others = [lt for lt in others if "mode" not in lt["detail"] and lt["log_tail"]]
    # lifetimes that said the same thing, once, with every one named (issue 41: a run whose
    # every commit was skipped printed one output 115 times)
    alike: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for lt in others:
        text = (render_op_detail(lt["detail"]) if lt["detail"].get("groups") is not None
                else "")
        key = (str(lt["verdict"]), str(lt["cause"] or lt["message"]), text + lt["log_tail"])
        alike.setdefault(key, []).append(lt)
    for (verdict, said, _), group in alike.items():
        lt = group[0]
        named = [f"{x['name']} {x['number']}" for x in group]
        who = (f"{code(lt['name'])} {lt['number']}" if len(group) == 1 else
               f"{len(group)} {kind.noun}s "
               f"({_names(named)})")
        lines += [f"**{who}**: {verdict}"]
        if said:
            lines += ["", esc(said)]
        if lt["detail"].get("groups") is not None:
            lines += ["", render_op_detail(lt["detail"])]
        if lt["log_tail"]:
            lines += ["", "Output:", "", fence(lt["log_tail"], "text")]
        lines.append("")
    return lines


def _gates(report: Mapping[str, Any]) -> list[str]:
    rejected = list((report.get("tiers") or {}).get("gate_rejected") or [])
    if not rejected:
        rejected = [{"name": ", ".join(g["names"]), "message": g["gate"]["message"]}
                    for g in report.get("causes") or [] if g.get("gate")]
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
    # the session id is the JSON's: a pasted report names nothing of the machine that ran it
    summary = (f"Reproduce{', and every lifetime in detail' if full else ''} "
               f"({version_words(report)})")
    return details(summary, body)


__all__ = ["closing", "evidence_notes", "evidence_table", "narrowing_section", "tool_source"]

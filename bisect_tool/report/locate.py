"""``bisect locate``'s report (issue 32, item 6): which side carries the change, cells named by
what they hold, the controls, the environment, and a next step that makes sense (for two
adjacent releases, the commit-level bisect between them, in a clone, with the right recipe).

Pure: the journal's contents in; the cells' counts and the finding are recomputed here with
the design's own pure functions (``designs.locate.counts_of``, ``matrix.conclude``), so a report
of a journal agrees with the run that wrote it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from bisect_tool.designs.locate import counts_of
from bisect_tool.journal import JournalContents
from bisect_tool.journal.entries import Observed
from bisect_tool.report import environment, evidence, reproduce
from bisect_tool.report.controls import controls as controls_facts
from bisect_tool.report.details import (
    lifetime_order,
    run_and_recipe,
    seen_words,
    tool_source,
    version_words,
)
from bisect_tool.report.names import commit_entry, name
from bisect_tool.report.text import code, details, esc, plural, table
from bisect_tool.strategy.matrix import (
    CELLS,
    MEANING,
    Cell,
    Explanation,
    Side,
    conclude,
    stop_threshold,
)
from bisect_tool.values import percent

_SHORT = {  # each explanation in a few words, for the first line
    Explanation.COMPILED: "the compiled side carries the change",
    Explanation.PYTHON: "the Python side carries the change",
    Explanation.INTERACTION: "only the two sides together show it",
    Explanation.EITHER: "both sides carry a change",
    Explanation.NOTHING: "nothing reproduced",
    Explanation.EVERYWHERE: "the good end shows the bug too",
}


def _files(recipe: Mapping[str, Any]) -> list[str]:
    return [PurePosixPath(str(f)).name for f in (recipe.get("artifacts") or {}).get("swap_set")
            or []]


def cell_name(cell: Cell, good: str, bad: str, compiled: str) -> str:
    """A cell by what it holds: "v0.26.0 as released", "v0.27.0 Python + v0.26.0 `_C...so`"."""
    py = good if cell.python is Side.GOOD else bad
    c = good if cell.compiled is Side.GOOD else bad
    if py == c:
        return f"{py} as released"
    return f"{py} Python + {c} {compiled}"


def _next(finding: Any, header: Mapping[str, Any], good: str, bad: str,
          recipe_arg: str, cells: list[dict[str, Any]]) -> dict[str, str]:
    """What to do next, in words and (where there is one) the command."""
    if not finding.decided:
        blocked = [c["name"] for c in cells if c["untestable"]]
        if blocked:
            words = (f"not decided: {' and '.join(blocked)} could not run here; run the cells "
                     "that could not on a machine where they load (e.g. with the torch their "
                     "Python side pins)")
        else:
            words = "not decided: more lifetimes per cell (`--lifetimes-per-cell`)"
        return {"words": words, "command": ""}
    if finding.explanation is Explanation.COMPILED:
        between = header.get("releases_between")
        if header.get("level") == "release" and isinstance(between, int) and between > 0:
            argv = ["bisect", "start", "--releases", "--good", good, "--bad", bad, "--recipe",
                    recipe_arg]
            words = (f"bisect the {between} releases between {bad} and {good} with the Python "
                     "side pinned, then the commits between the two it names")
        else:
            argv = ["bisect", "start", "--good", good, "--bad", bad, "--recipe", recipe_arg]
            words = (f"bisect the commits between {bad} and {good}, with the Python side pinned, "
                     "in a vLLM clone")
        return {"words": words, "command": shlex.join(argv)}
    if finding.explanation is Explanation.PYTHON:
        return {"words": "bisect the whole package between the two ends (the compiled side "
                         "pinned): `bisect start --run` with a script that installs each commit",
                "command": ""}
    return {"words": MEANING[finding.explanation], "command": ""}


def build_locate_report(contents: JournalContents,
                        bundled_recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything the locate report shows, as plain JSON values."""
    header = contents.header
    recipe: Mapping[str, Any] = header.get("recipe") or {}
    commits = [commit_entry(c, i, "") for i, c in enumerate(header.get("candidates") or [])]
    good, bad = name(commits[0]), name(commits[1])
    files = _files(recipe)
    compiled = ", ".join(f"`{f}`" for f in files) or "compiled side"
    confidence = float((recipe.get("search") or {}).get("confidence") or 0.99)
    observations = contents.observed
    counts = counts_of(observations)
    finding = conclude(counts, confidence)
    env = environment.merged(contents)
    by_cell: dict[str, list[Observed]] = {}
    for obs in observations:
        by_cell.setdefault(obs.cell, []).append(obs)
    cells = []
    for cell in CELLS:
        c = counts[cell]
        cells.append({
            "key": cell.key, "name": cell_name(cell, good, bad, compiled),
            "python": good if cell.python is Side.GOOD else bad,
            "compiled": good if cell.compiled is Side.GOOD else bad,
            "lifetimes": c.total, "divergent": c.divergent,
            # why, without the lifetime's id (the evidence's notes name it and its log)
            "untestable": re.sub(r"^lifetime \S+: ", "", c.untestable) or None,
            "ran": len(by_cell.get(cell.key, [])),
        })
    lifetimes = evidence.lifetimes(contents, commits)
    cell_of = {o.lifetime_id: o.cell for o in observations}
    names = {c["key"]: c["name"] for c in cells}
    for lt in lifetimes:
        lt["cell"] = names.get(cell_of.get(str(lt["lifetime_id"]), ""), "?")
    recipe_arg = reproduce.recipe_arg(recipe, bundled_recipe)
    reported, reported_changed = environment.reported_setup(recipe, bundled_recipe)
    differences = environment.differences(env, recipe, reported)
    if differences is not None:
        differences["reported_changed"] = reported_changed
    return {
        "kind": "locate",
        "session": header.get("session"),
        "tool_version": header.get("tool_version"),
        "level": header.get("level") or "commit",
        "good": good, "bad": bad, "files": files,
        "finding": {
            "explanation": str(finding.explanation),
            "words": _SHORT[finding.explanation],
            "meaning": MEANING[finding.explanation],
            "probability": finding.probability,
            "decided": finding.decided,
            "asked": confidence,
            "stop_at": stop_threshold(confidence),
            "posterior": {str(k): v for k, v in sorted(finding.posterior.items(),
                                                       key=lambda kv: -kv[1])},
            "tied": [str(t) for t in finding.tied],
        },
        "cells": cells,
        "lifetimes": lifetimes,
        "next": _next(finding, header, good, bad, recipe_arg, cells),
        "controls": controls_facts(contents, commits, recipe, good),
        "environment": env,
        "environment_block": environment.block(env, recipe, [], lifetimes),
        "held_fixed": _held_fixed(env),
        "python_dirs": bool(header.get("python_dirs")),
        "differences": differences,
        "reproduce": {
            "command": reproduce.command(header.get("command"), recipe, bundled_recipe),
            "recipe_file": recipe_arg, "recipe_name": recipe.get("name"),
            "changes": reproduce.changes(recipe, bundled_recipe)[0],
            "left_out": reproduce.changes(recipe, bundled_recipe)[1],
        },
    }


def _held_fixed(env: Mapping[str, Any]) -> list[str]:
    """Files that are the same in both Python sides (by sha256; recorded since issue 32)."""
    good = env.get("sides.good.files") or {}
    bad = env.get("sides.bad.files") or {}
    if not isinstance(good, Mapping) or not isinstance(bad, Mapping):
        return []
    return sorted(str(k) for k in good if k in bad and good[k] == bad[k])


def _first_line(r: Mapping[str, Any]) -> list[str]:
    f = r["finding"]
    cells = {c["key"]: c for c in r["cells"]}
    bg, gb = cells["python=bad,compiled=good"], cells["python=good,compiled=bad"]

    def said(c: Mapping[str, Any]) -> str:
        if c["untestable"]:
            return f"{c['name']} could not run"
        if not c["divergent"]:
            return f"{c['name']} was clean in {c['lifetimes']} of {c['lifetimes']}"
        return f"{c['name']} diverged in {c['divergent']} of {plural(c['lifetimes'], 'lifetime')}"

    if not f["decided"]:
        return [f"**Not decided**: {f['words']} at {percent(f['probability'])}, below the "
                f"{percent(f['stop_at'])} the run stops at. {said(bg)}; {said(gb)}."]
    return [f"**{f['words'][0].upper()}{f['words'][1:]}** — **{percent(f['probability'])}**. "
            f"{said(bg)}; {said(gb)}."]


def render_locate_markdown(r: Mapping[str, Any]) -> str:
    f = r["finding"]
    title = (f"## Locate: {f['words']} ({percent(f['probability'])})" if f["decided"] else
             f"## Locate: not decided ({f['words']}: {percent(f['probability'])})")
    lines = [title, "", *_first_line(r), ""]
    level = "releases" if r["level"] == "release" else "commits"
    files = ", ".join(code(x) for x in r["files"])
    lines.append(f"- Ends: {code(r['bad'])} (bad) and {code(r['good'])} (good), {level}; each "
                 f"cell is one end's Python side with one end's {files}")
    nxt = r["next"]
    lines.append(f"- Next: {nxt['words']}" + (f": {code(nxt['command'])}"
                                                  if nxt["command"] else ""))
    diff = r.get("differences")
    known, unknown = environment.short_list(diff)
    if diff and (known or unknown):
        lines.append(f"- Not as reported in {esc(diff['issue'])}: "
                     f"{', '.join(known) or 'nothing known'}"
                     + (f"; not recorded or not checked by this run: {', '.join(unknown)}"
                        if unknown else "")
                     + " (see Environment)")
    lines += ["", *environment.reported_warning(diff), "### Cells", ""]
    rows = []
    for c in r["cells"]:
        rows.append([c["name"], code(c["python"]), code(c["compiled"]), str(c["lifetimes"]),
                     str(c["divergent"]), esc(c["untestable"] or "-")])
    lines += table(["Cell", "Python side", "Compiled side", "Lifetimes", "Divergent",
                    "Could not run"], rows, "lllrrl")
    held = r.get("held_fixed") or []
    torch = r["environment"].get("torch")
    if torch or held:
        lines += ["", "The same in every cell: " + ", ".join(
            ([f"PyTorch {esc(torch)}"] if torch else [])
            + [f"{code(h)} (one file in both Python sides)" for h in held]) + "."]
    if r.get("python_dirs") and not r["environment"].get("sides.good.files"):
        lines += ["", "The Python sides came from folders (`--good-python`, `--bad-python`); "
                  "what they held besides each release's own package is not recorded by this "
                  "run."]
    lines += ["", "### How sure", ""]
    post = [[esc(MEANING[Explanation(k)]), percent(v)] for k, v in f["posterior"].items()]
    lines += table(["Explanation", "Posterior"], post, "lr")
    lines += ["", f"Asked {percent(f['asked'])}; the run stops at {percent(f['stop_at'])}. "
              "Each cell's lifetimes are scored with the bisect's own model (p and q integrated "
              "out)."]
    if f["tied"]:
        lines[-1] += (f" The cells that ran cannot tell it apart from: "
                      f"{', '.join(esc(t) for t in f['tied'])}.")
    lines += ["", "### Evidence", ""]
    order = {c["name"]: i for i, c in enumerate(r["cells"])}
    rows_ev = []
    for lt in sorted(r["lifetimes"], key=lambda x: (order.get(x["cell"], 9),
                                                     lifetime_order(x)[1:])):
        rows_ev.append([lt["cell"], code(lt["number"]), f"**{lt['verdict']}**",
                        "-" if lt["coresidency"] is None else f"{lt['coresidency']}",
                        "-" if lt["distinct_outputs"] is None else
                        f"{lt['distinct_outputs']} / {lt['repeats']}",
                        "-†" if lt.get("delta_after_divergence") is not None else
                        ("-" if lt["max_abs_delta"] is None else f"{lt['max_abs_delta']:.3e}"
                         if lt["max_abs_delta"] else "0"),
                        esc(lt.get("first_token_difference") if lt.get("first_token_difference")
                            is not None else "-")])
    lines += table(["Cell", "Lifetime", "Verdict", "Co-residency", "Distinct outputs / repeats",
                    "Max \\|Δ logprob\\| up to the first differing token",
                    "First token that differs"], rows_ev) if rows_ev else ["No lifetime ran."]
    notes = [f"- {lt['cell']} {lt['number']} could not run: {esc(lt['cause'])}"
             + (f" (the whole log: `logs/{lt['lifetime_id']}.log` in the state dir)"
                if lt.get("has_log") else "")
             for lt in r["lifetimes"] if lt["verdict"] == "UNTESTABLE"]
    late = [lt for lt in r["lifetimes"] if lt.get("delta_after_divergence") is not None]
    if late:
        notes.append(f"- † The tokens moved in {plural(len(late), 'lifetime')} of this run, and "
                     "it recorded the logprob delta over the positions after they diverged too, "
                     "where the two outputs follow different tokens: not a like-for-like "
                     "difference, so it is left out. The probe now stops comparing at the first "
                     "differing token.")
    if notes:
        lines += ["", *notes]
    lines += ["", "### Controls", ""]
    c = r.get("controls")
    if c is None:
        lines += ["Not run (`--no-controls`): a clean cell is unverified evidence."]
    else:
        lines += [f"Run on {code(c['candidate'])} as released, booted with "
                  f"{code(c['switch'] + '=0')}:", "",
                  f"- Positive (concurrent, batch invariance off): **{c['positive']['verdict']}**"
                  f"{seen_words(c['positive'])}",
                  f"- Negative (one request at a time): **{c['negative']['verdict']}**"
                  f"{seen_words(c['negative'])}"]
        if c.get("problem"):
            lines += ["", f"The controls did not hold: {esc(c['problem'])}"]
    lines += ["", "### Environment", ""]
    block = r.get("environment_block") or []
    lines += (table(["What", "Value"], [[esc(k), esc(v)] for k, v in block]) if block
              else ["Not recorded by this run."])
    if diff and diff["rows"]:
        lines += ["", f"Differences from the setup reported in {esc(diff['issue'])}:", ""]
        lines += table(["What", "Reported", "This run"],
                       [[w if w.startswith("`") else esc(w), esc(a), esc(b)]
                        for w, a, b in diff["rows"]])
    rp = r["reproduce"]
    # the session id is the JSON's: a pasted report names nothing of the machine that ran it
    body = [tool_source(r), "", *run_and_recipe("The locate", rp)]
    lines += ["", *details(f"Reproduce ({version_words(r)})", body)]
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["build_locate_report", "render_locate_markdown"]

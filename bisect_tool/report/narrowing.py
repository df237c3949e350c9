"""The op check's narrowing of a tiered run, as one section (issue 32, item 9): what it ran,
what it saw per candidate, where it put the flip, what the server lifetimes then ran, and the
compatibility gate: which ops it compared and every op it rejected (item 7). Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.journal import JournalContents
from bisect_tool.kinds import narrowing as narrow_kind
from bisect_tool.report.evidence import why
from bisect_tool.report.names import index_of, name, num, rename, short_ref
from bisect_tool.strategy.tiers import Tier

_FIRST_OP = re.compile(r"(?:op (\S+) changed|candidate lacks op (\S+))")
_MORE = re.compile(r"\(and (\d+) more(?:: (.*))?\)\s*$")
_GATE_HEAD = re.compile(r"^candidate \S+: (\S+): ")
#: the tool's words for its tiers, as a maintainer says them (journaled messages keep them)
_PLAIN = (
    ("the fast probe's flip", "the op check's flip"),
    ("the fast probe", "the op check"), ("fast probe", "op check"),
    ("the faithful probe", "a server lifetime"), ("faithful probe", "server lifetime"),
    ("faithful lifetimes", "server lifetimes"), ("faithful tier", "server lifetimes"),
    ("stand-in", "proxy"),
)


def plain(text: str) -> str:
    """A journaled message without the tool's tier jargon."""
    for old, new in _PLAIN:
        text = text.replace(old, new)
    return text


def is_gate_verdict(message: str) -> bool:
    """Whether a message is the compatibility gate's refusal (it names the file and an op)."""
    return bool(_GATE_HEAD.match(message) and _FIRST_OP.search(message))


def gate_verdict(message: str) -> dict[str, Any]:
    """The gate's verdict taken apart: the file, every op it names, how many more it counted
    without naming them (journals before the gate named them all), the message whole."""
    head = _GATE_HEAD.match(message)
    first = _FIRST_OP.search(message)
    ops = [next(g for g in first.groups() if g)] if first else []
    more = _MORE.search(message)
    unnamed = 0
    if more:
        named = [x.strip() for x in (more.group(2) or "").split(",") if x.strip()]
        ops += named
        unnamed = int(more.group(1)) - len(named)
    return {"file": head.group(1) if head else None, "ops": ops, "unnamed": max(unnamed, 0),
            "message": message}


def _what_ran(probe: Mapping[str, Any]) -> str:
    ops = ", ".join(str(o) for o in probe.get("ops") or ()) or "the recipe's ops"
    dtypes = ", ".join(str(d) for d in probe.get("dtypes") or ())
    hidden = ", ".join(str(h) for h in probe.get("hidden_sizes") or ())
    rows: Sequence[Any] = probe.get("row_counts") or ()
    out = ops
    if dtypes:
        out += f" in {dtypes}"
    if hidden:
        out += f", hidden {hidden}"
    if len(rows) == 2:
        out += (f", {probe.get('seeds', '?')} seeds: the first {rows[0]} rows of a {rows[0]}-row "
                f"launch against a {rows[1]}-row launch, bitwise")
    env = probe.get("invariance_env")
    return out + (f", with {env}=1" if env else "")


def narrowing(
    contents: JournalContents,
    commits: Sequence[Mapping[str, Any]],
    state_tiers: Mapping[str, Any] | None,
    recipe: Mapping[str, Any],
) -> dict[str, Any] | None:
    if not state_tiers:
        return None
    rows: dict[int, dict[str, Any]] = {}
    server: dict[int, list[int]] = {}
    for obs in contents.observed:
        index = index_of(obs, commits)
        if index < 0:
            continue
        verdict = str(obs.verdict)
        if obs.tier is not Tier.NARROW:
            counts = server.setdefault(index, [0, 0])
            counts[0] += verdict in ("divergent", "clean")  # the lifetimes that said something
            counts[1] += verdict == "divergent"
            continue
        c = commits[index]
        row = rows.setdefault(index, {
            "index": index, "name": name(c), "commit_url": c.get("commit_url"), "runs": 0,
            "divergent": 0, "clean": 0, "untestable": 0, "saw": "", "gate": None,
        })
        row["runs"] += 1
        row["divergent" if verdict == "divergent" else "clean" if verdict == "clean"
            else "untestable"] += 1
        row["saw"] = why(obs.message, commits)
        if obs.detail.get("gate") is not None:
            gate = rename(str(obs.detail["gate"]), commits)
            row["gate"] = "ok" if gate == "ok" else gate_verdict(gate)
    for row in rows.values():
        row["verdict"] = ("DIVERGENT" if row["divergent"] else "CLEAN" if row["clean"]
                          else "UNTESTABLE")
    by_sha = {c["sha"]: c for c in commits}
    flip = str(state_tiers.get("narrow_flip") or "")
    sides = None
    if state_tiers.get("sides"):
        bad, good = (int(x) for x in state_tiers["sides"])

        def side(i: int) -> dict[str, Any]:
            n, d = server.get(i, [0, 0])
            return {"index": i, "name": name(commits[i]),
                    "commit_url": commits[i].get("commit_url"), "lifetimes": n, "divergent": d}

        sides = {"bad": side(bad), "good": side(good)}
    runtime = recipe.get("runtime") or {}
    swap = [str(x) for x in (recipe.get("artifacts") or {}).get("swap_set") or []]
    fell_back = next((str(e.get("message") or "") for e in contents.of_type("phase")
                      if e.get("phase") == "faithful"), "")
    return {
        "kind": state_tiers.get("kind") or narrow_kind(None).name,
        "phase": state_tiers.get("phase"),
        "what_ran": _what_ran(recipe.get("probe") or {}),
        "flip": name(by_sha[flip]) if flip in by_sha else short_ref(flip),
        "confidence": num(state_tiers.get("narrow_confidence")),
        "runs": state_tiers.get("narrow_runs"),
        "candidates": len(rows),
        "server_lifetimes": state_tiers.get("faithful_lifetimes"),
        "stand_in_prior": num(state_tiers.get("stand_in_prior")),
        "stand_in_probability": num(state_tiers.get("stand_in_probability")),
        "sides": sides,
        "fell_back": plain(fell_back) if fell_back else None,
        "phases": [{"phase": str(e.get("phase")), "message": str(e.get("message") or "")}
                   for e in contents.of_type("phase")],
        "rows": [rows[i] for i in sorted(rows)],
        # what the gate compared: the recipe's gate_ops, else every op the pinned file has
        "gate_compared": [str(o) for o in runtime.get("gate_ops") or ()] or None,
        "gate_files": swap,
        "gate_rejected": [{"name": r["name"], **r["gate"]} for r in
                          (rows[i] for i in sorted(rows)) if isinstance(r["gate"], dict)],
    }

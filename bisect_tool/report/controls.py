"""The controls, and where they ran (issue 32, item 5): on which candidate's compiled side,
under which Python side, with which setting; what each saw, in the same words as the evidence.
Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.cause import one_line
from bisect_tool.journal import JournalContents
from bisect_tool.report.names import name, no_local_paths, rename, short_ref


def _seen(side: Mapping[str, Any], commits: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    raw = side.get("detail")
    d: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    verdict = str(side.get("verdict", "missing")).upper()
    out: dict[str, Any] = {
        "verdict": verdict,
        "lifetime_id": d.get("lifetime_id"),
        "distinct_outputs": d.get("distinct_outputs"),
        "repeats": d.get("repeats"),
        "pairs": len(d.get("differing_pairs") or []),
        "coresidency": d.get("max_coresidency"),
        "first_token_difference": d.get("first_token_divergence_position"),
        "tokens_moved": d.get("tokens_moved"),
        # why it could not run, in one line (the message keeps the log tail in the JSON)
        "message": no_local_paths(rename(one_line(str(side.get("message") or "")), commits)),
    }
    return out


def controls(contents: JournalContents, commits: Sequence[Mapping[str, Any]],
             recipe: Mapping[str, Any], python_side: str | None) -> dict[str, Any] | None:
    """The last controls entry: where, what each control saw, whether they held; controls
    entries of candidates that could not run them, by name."""
    entries = [e for e in contents.of_type("controls") if not e.get("untestable")]
    refused = [e for e in contents.of_type("controls") if e.get("untestable")]
    if not entries and not refused:
        return None
    last = (entries or refused)[-1]
    by_sha = {c["sha"]: c for c in commits}
    sha = str(last.get("commit") or "")
    positive = _seen(last.get("positive") or {}, commits)
    negative = _seen(last.get("negative") or {}, commits)
    probe = recipe.get("probe") or {}
    runtime = recipe.get("runtime") or {}
    switch = str(probe.get("invariance_env") or "VLLM_BATCH_INVARIANT")
    others = {k: v for k, v in (runtime.get("env") or {}).items() if k != switch}
    shared = bool(positive["lifetime_id"]) and positive["lifetime_id"] == negative["lifetime_id"]
    # [probe] suspects: which settings showed divergence, in words (probes.controls); only
    # where the run had them, so earlier reports stay as they were
    suspects = [no_local_paths(rename(str(f), commits))
                for f in (last.get("suspects") or {}).get("findings") or []]
    return {
        **({"suspects": suspects} if suspects else {}),
        "ok": bool(last.get("ok", positive["verdict"] == "DIVERGENT"
                            and negative["verdict"] == "CLEAN")),
        "problem": no_local_paths(rename(one_line(str(last.get("problem") or "")), commits)),
        "candidate": name(by_sha[sha]) if sha in by_sha else short_ref(sha),
        "python_side": python_side,
        "switch": switch,
        "other_env": {str(k): str(v) for k, v in others.items()},
        "one_lifetime": shared,
        "attempts": last.get("attempts"),
        "workload": {"requests": probe.get("requests"), "fillers": probe.get("fillers")},
        "positive": positive,
        "negative": negative,
        "positive_diverged": positive["verdict"] == "DIVERGENT",
        "negative_clean": negative["verdict"] == "CLEAN",
        "refused": [{"candidate": name(by_sha[str(e.get("commit"))])
                     if str(e.get("commit")) in by_sha else short_ref(str(e.get("commit"))),
                     "why": no_local_paths(rename(one_line(str(e.get("problem") or "")),
                                                  commits))}
                    for e in refused],
    }

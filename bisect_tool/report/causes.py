"""Why candidates could not run, one line a cause, with how many it stopped and advice that fits
it (issue 41: a run with no answer listed one cause 115 times and advised "pick another --bad",
where every commit had been skipped by the probe itself). Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.report.narrowing import gate_verdict, is_gate_verdict

_OWN_NAME = re.compile(r"^candidate \S+: ")


def groups(untestable: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The candidates that could not run (``evidence.untestables``), one group per cause, in the
    order each cause first shows: ``cause`` (its words, without a candidate's own name),
    ``names``, ``gate`` (the gate's verdict taken apart, for a refusal), ``log`` (a lifetime
    whose whole log says more)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for u in untestable:
        full = str(u.get("full") or u.get("message") or "")
        gate = gate_verdict(full) if is_gate_verdict(full) else None
        if gate is not None:
            key: tuple[Any, ...] = ("gate", gate["file"], tuple(gate["ops"]), gate["unnamed"])
            cause = f"the pinned stack's gate refused its {gate['file'] or 'extension'}"
        else:
            cause = _OWN_NAME.sub("", str(u.get("message") or "")) or "no reason recorded"
            key = ("text", cause)
        group = out.setdefault(key, {"cause": cause, "names": [], "gate": gate, "log": None,
                                     "advice": advice(cause, gate)})
        group["names"].append(str(u["name"]))
        group["log"] = group["log"] or u.get("log")
    return list(out.values())


def advice(cause: str, gate: Mapping[str, Any] | None) -> str:
    """What to do about a cause that stopped every candidate: not another end, but this."""
    if gate is not None:
        return ("the pinned Python side cannot load these candidates' compiled files: pin a "
                "Python side nearer the range ([runtime] pinned_package_dir or --python), or have "
                "the gate compare only the ops the probe needs ([runtime] gate_ops)")
    low = cause.lower()
    if re.search(r"\bexit 125\b", low):
        return ("the probe itself skips (exit 125) every commit: run the --run command by hand "
                "in one commit's worktree and see why")
    if "build" in low:
        return ("every build failed: the build log it names says why; check [artifacts] "
                "build_command")
    if "/health" in low or "server exited" in low or "boot" in low:
        return ("the server does not boot: the lifetime's log it names says why; check [runtime] "
                "python and server_args")
    if "no artifact" in low:
        return "no candidate's compiled files could be had: check [artifacts] sources"
    return "it is the setup, not the ends: fix it, then start again"


def only_cause(causes: Sequence[Mapping[str, Any]], ran: int) -> Mapping[str, Any] | None:
    """The one cause that stopped every candidate tried, where nothing ran at all (then the
    ends are not what to change)."""
    if ran or len(causes) != 1:
        return None
    return causes[0]

"""What the server lifetimes saw: one row per lifetime, one per candidate, and the candidates
that could not run with why, in one line. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.cause import one_line
from bisect_tool.journal import JournalContents
from bisect_tool.journal.entries import Observed
from bisect_tool.report.names import (
    index_of,
    lifetime_number,
    name,
    no_local_paths,
    rename,
    short_ref,
)
from bisect_tool.values import Verdict
from bisect_tool.verdict import aggregate

# uvicorn's access log ("127.0.0.1:36066 - "POST /v1/completions HTTP/1.1" 200 OK"): the
# lifetime's log tail keeps the engine's configuration lines and errors, not the requests
_ACCESS_LOG = re.compile(r'"(GET|POST|PUT|DELETE|HEAD|OPTIONS) \S+ HTTP/[\d.]+" \d{3}')
#: what ``compare.DELTA_SCOPE`` records: the delta stops at the first differing token
DELTA_SCOPE = "up_to_first_token_divergence"


def why(message: str, commits: Sequence[Mapping[str, Any]]) -> str:
    """Why something could not run, in one line, candidates spelled as the report spells them
    and without the lifetime's id (the row or the note names the lifetime)."""
    return no_local_paths(rename(re.sub(r"^lifetime \S+: ", "", one_line(message)), commits))


def _whole(message: str, commits: Sequence[Mapping[str, Any]]) -> str:
    """A message's own first line whole (a gate's verdict names every op: ``why`` cuts at 400
    characters, and cut a name in half), candidates spelled as the report spells them."""
    first = str(message or "").strip().partition("\n")[0]
    return no_local_paths(rename(re.sub(r"^lifetime \S+: ", "", first), commits))


def quiet_log(text: str) -> str:
    """A log tail without HTTP access-log lines (the engine's config lines and errors stay)."""
    return "\n".join(line for line in text.splitlines() if not _ACCESS_LOG.search(line))


def without_fast_probe(contents: JournalContents) -> JournalContents:
    """The journal without the fast probe's runs: the evidence, the rates and the ends are the
    server lifetimes' (the op check has its own section)."""
    return JournalContents(
        contents.header,
        tuple(e for e in contents.entries
              if not (e.get("type") == "observation" and e.get("tier") == "narrow")),
        contents.torn_tail,
    )


def _numbers(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


def detail_delta(detail: Mapping[str, Any]) -> float | None:
    """The largest difference one lifetime saw: server logprobs (only where it is comparable:
    up to the first differing token), or op outputs."""
    value = detail.get("max_abs_logprob_delta")
    if isinstance(value, int | float):
        comparable = (detail.get("max_abs_logprob_delta_scope") == DELTA_SCOPE
                      or not detail.get("tokens_moved"))
        return float(value) if comparable else None
    groups = detail.get("groups")
    if isinstance(groups, list):
        worst = _numbers([g.get("max_abs_diff") for g in groups if isinstance(g, Mapping)])
        return max(worst) if worst else None
    return None


def _moved(detail: Mapping[str, Any]) -> str | None:
    if "tokens_moved" not in detail:
        return None
    if not detail.get("distinct_outputs") or detail.get("distinct_outputs") == 1:
        return "nothing"
    return "tokens" if detail.get("tokens_moved") else "logprobs only"


def lifetimes(contents: JournalContents, commits: Sequence[Mapping[str, Any]]
              ) -> list[dict[str, Any]]:
    out = []
    for obs in contents.observed:
        index = index_of(obs, commits)
        detail = obs.detail
        sha = obs.commit or (str(commits[index]["sha"]) if index >= 0 else "")
        verdict = str(obs.verdict).upper()
        recorded = detail.get("max_abs_logprob_delta")
        out.append({
            "seq": obs.seq,
            "lifetime_id": obs.lifetime_id,
            "number": lifetime_number(obs.lifetime_id),
            "sha": sha,
            "name": name(commits[index]) if index >= 0 else short_ref(sha),
            "index": index,
            "verdict": verdict,
            "message": obs.message,
            # why it could not run, in one line (the whole message stays in the JSON)
            "cause": why(obs.message, commits) if verdict == "UNTESTABLE" else "",
            "has_log": "log tail" in obs.message,
            "duration_s": obs.duration_s,
            "detail": dict(detail),
            "log_tail": no_local_paths(quiet_log(str(detail.get("log_tail") or ""))),
            "coresidency": detail.get("max_coresidency"),
            "target": detail.get("target_coresidency"),
            "distinct_outputs": detail.get("distinct_outputs"),
            "repeats": detail.get("repeats"),
            "max_abs_delta": detail_delta(detail),
            # recorded over positions after the tokens diverged: not comparable, shown apart
            "delta_after_divergence": (float(recorded) if isinstance(recorded, int | float)
                                       and detail_delta(detail) is None else None),
            "first_difference": detail.get("first_divergent_position"),
            "first_token_difference": detail.get("first_token_divergence_position"),
            "moved": _moved(detail),
        })
    return out


def tested(contents: JournalContents, commits: Sequence[Mapping[str, Any]], bad_end: int,
           good_end: int) -> list[dict[str, Any]]:
    """One row per candidate with lifetimes (or an ``untestable`` entry): its counts, its
    verdict by the search's own rule, and the swapped files' hashes."""
    rows: dict[int, dict[str, Any]] = {}

    def row(index: int) -> dict[str, Any]:
        if index not in rows:
            c = commits[index]
            role = "bad end" if index == bad_end else "good end" if index == good_end else None
            rows[index] = {
                **{k: c[k] for k in ("index", "sha", "short", "name", "subject", "pr", "tags",
                                     "commit_url", "pr_url")},
                "role": role, "lifetimes": 0, "divergent": 0, "clean": 0, "inconclusive": 0,
                "untestable_lifetimes": 0, "untestable": False, "untestable_message": None,
                "distinct_outputs": None, "repeats": None, "max_abs_delta": None,
                "max_coresidency": None, "min_coresidency": None, "target_coresidency": None,
                "_details": [],
            }
        return rows[index]

    for obs in contents.observed:
        index = index_of(obs, commits)
        if index < 0:
            continue
        r = row(index)
        r["lifetimes"] += 1
        key = {"divergent": "divergent", "clean": "clean", "untestable": "untestable_lifetimes"}
        r[key.get(str(obs.verdict), "inconclusive")] += 1
        r["_details"].append(obs.detail)
    for entry in contents.refused:
        index = index_of(entry, commits)
        if index < 0:
            continue
        r = row(index)
        r["untestable"] = True
        r["untestable_message"] = why(entry.message, commits)
    out = []
    for index in sorted(rows):
        r = rows[index]
        found: list[Mapping[str, Any]] = r.pop("_details")
        with_distinct = [d for d in found if isinstance(d.get("distinct_outputs"), int)]
        if with_distinct:
            worst = max(with_distinct, key=lambda d: int(d["distinct_outputs"]))
            r["distinct_outputs"] = worst["distinct_outputs"]
            r["repeats"] = worst.get("repeats")
        deltas = _numbers([detail_delta(d) for d in found])
        r["max_abs_delta"] = max(deltas) if deltas else None
        cores = _numbers([d.get("max_coresidency") for d in found])
        r["max_coresidency"] = int(max(cores)) if cores else None
        # the lowest repeat peak shows a lifetime whose batch never formed (INCONCLUSIVE)
        peaks = _numbers([p for d in found if isinstance(d.get("coresidency_per_repeat"), list)
                          for p in d["coresidency_per_repeat"]])
        r["min_coresidency"] = int(min(peaks)) if peaks else None
        targets = _numbers([d.get("target_coresidency") for d in found])
        r["target_coresidency"] = int(max(targets)) if targets else None
        r["verdict"] = _aggregate(r)
        r["swap_sha256"] = {str(k): str(v) for d in found
                            if isinstance(d.get("swap_sha256"), Mapping)
                            for k, v in d["swap_sha256"].items()}
        out.append(r)
    return out


def _aggregate(r: Mapping[str, Any]) -> str:
    """The candidate's verdict over its lifetimes: the search's own rule (``verdict.aggregate``);
    an ``untestable`` entry without lifetimes is UNTESTABLE."""
    verdicts = (
        [Verdict.DIVERGENT] * r["divergent"]
        + [Verdict.CLEAN] * r["clean"]
        + [Verdict.INCONCLUSIVE] * r["inconclusive"]
        + [Verdict.UNTESTABLE] * (r["untestable_lifetimes"] + int(bool(r["untestable"])))
    )
    return aggregate(verdicts).value.upper()


def untestables(contents: JournalContents, commits: Sequence[Mapping[str, Any]]
                ) -> list[dict[str, Any]]:
    """The candidates that could not run, each with why in one line (the gate's verdict, the
    first error of a dead server's log): ``untestable`` entries, then candidates whose every
    lifetime was UNTESTABLE."""
    out = []
    for entry in contents.refused:
        index = index_of(entry, commits)
        sha = entry.commit
        out.append({"sha": sha, "short": short_ref(sha), "index": index,
                    "name": name(commits[index]) if index >= 0 else short_ref(sha),
                    "message": why(entry.message, commits),
                    "full": _whole(entry.message, commits)})
    listed = {u["sha"] for u in out}
    by_index: dict[int, list[Observed]] = {}
    for obs in contents.observed:
        index = index_of(obs, commits)
        if index >= 0:
            by_index.setdefault(index, []).append(obs)
    for index, seen in sorted(by_index.items()):
        sha = str(commits[index]["sha"])
        if sha in listed or any(o.verdict is not Verdict.UNTESTABLE for o in seen):
            continue
        last = seen[-1].message
        out.append({"sha": sha, "short": short_ref(sha), "index": index,
                    "name": name(commits[index]), "message": why(last, commits),
                    "full": _whole(last, commits), "lifetimes": len(seen),
                    # the lifetime whose whole log says more (a server's, not the gate's)
                    "log": seen[-1].lifetime_id if "log tail" in last else None})
    return out

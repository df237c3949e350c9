"""The report's facts: a journal reduced to one JSON-serialisable dict, no prose.

Pure: the inputs are a journal's contents and a :class:`SearchState` (the strategy's summary
after replaying that journal); no git, no network. The Markdown and JSON renderers only format
this dict, so the two outputs cannot disagree.

Header keys read (others are ignored): ``candidates`` (``{sha, subject, pr, tags}``, old end
first), ``direction``, ``good_ref``/``bad_ref`` (as typed), ``good``/``bad`` (full SHAs; or
``good_sha``/``bad_sha``), ``recipe`` (``Recipe.to_dict()``), ``tool_version``, ``command`` (argv
list or string), ``session``. The last ``end`` entry's ``message`` explains a stop.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.errors import StateError
from bisect_tool.journal import JournalContents
from bisect_tool.values import SearchState, Verdict
from bisect_tool.verdict import aggregate

REPORT_VERSION = 1
SHORT = 7
_PR_IN_SUBJECT = re.compile(r"\s*\(#(\d+)\)\s*$")

# ---------------------------------------------------------------------------------------------
# building the dict


def build_report(
    contents: JournalContents,
    state: SearchState,
    *,
    repo_url: str = "https://github.com/vllm-project/vllm",
) -> dict[str, Any]:
    """Everything the Markdown shows, as plain JSON values."""
    repo_url = repo_url.rstrip("/")
    header = contents.header
    raw_candidates = header.get("candidates") or []
    if not raw_candidates:
        raise StateError("the journal header lists no candidates; the session never started")
    if len(state.posterior) != len(raw_candidates):
        raise StateError(
            f"posterior has {len(state.posterior)} entries but the journal lists "
            f"{len(raw_candidates)} candidates; replay the journal with the same range"
        )
    commits = [_commit(c, i, repo_url) for i, c in enumerate(raw_candidates)]
    by_sha = {c["sha"]: c for c in commits}
    direction = state.direction or str(header.get("direction", "regression"))
    last = len(commits) - 1
    # Index 0 is the old end: good when finding a regression, bad when finding a fix.
    bad_end = 0 if direction == "fix" else last
    good_end = last if direction == "fix" else 0

    tested = _tested(contents, commits, bad_end, good_end)
    recipe = header.get("recipe") or {}
    probe_kind = str((recipe.get("probe") or {}).get("kind", "server"))
    bad_end_lifetimes = next((t["lifetimes"] for t in tested if t["index"] == bad_end), 0)
    return {
        "report_version": REPORT_VERSION,
        "repo_url": repo_url,
        "session": header.get("session") or header.get("session_id"),
        "tool_version": header.get("tool_version"),
        "started": header.get("started"),
        "answer": {
            "state": state.state,
            "direction": direction,
            "flip_block": [_lookup(by_sha, s, repo_url) for s in state.flip_block],
            "confidence": _num(state.confidence),
            "credible_set": [_lookup(by_sha, s, repo_url) for s in state.credible_set],
            "p_median": _num(state.p_median),
            "p_interval": [_num(x) for x in state.p_interval],
            "q_median": _num(state.q_median),
            "q_interval": [_num(x) for x in state.q_interval],
            "evaluations": state.evaluations,
            "candidates_tested": state.candidates_tested,
            "bad_end_lifetimes": bad_end_lifetimes,
            "end_message": _end_message(contents.end),
        },
        "range": {
            "good_ref": _ref(header, "good"),
            "good_sha": _sha(header, "good") or commits[good_end]["sha"],
            "bad_ref": _ref(header, "bad"),
            "bad_sha": _sha(header, "bad") or commits[bad_end]["sha"],
            "direction": direction,
            "candidates": len(commits),
            "old_end": commits[0]["sha"],
            "new_end": commits[last]["sha"],
            "good_end_index": good_end,
            "bad_end_index": bad_end,
            "compare_url": f"{repo_url}/compare/{commits[0]['sha']}...{commits[last]['sha']}",
        },
        "environment": _environment(contents),
        "recipe": _recipe_summary(recipe),
        "probe_kind": probe_kind,
        "controls": _controls(contents),
        "tested": tested,
        "lifetimes": _lifetimes(contents, commits),
        "untestable": _untestables(contents, commits),
        "posterior": [_num(x) or 0.0 for x in state.posterior],
        "commits": [{k: c[k] for k in ("sha", "short", "subject", "pr")} for c in commits],
        "reproduce": _command(header.get("command")),
        "plot": None,
    }


_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


def _ref(header: Mapping[str, Any], end: str) -> str | None:
    """The ref as the user typed it: ``good_ref``, or ``good`` when that is not a full SHA."""
    for value in (header.get(f"{end}_ref"), header.get(end)):
        if isinstance(value, str) and value and not _FULL_SHA.match(value):
            return value
    return None


def _sha(header: Mapping[str, Any], end: str) -> str | None:
    for value in (header.get(f"{end}_sha"), header.get(end)):
        if isinstance(value, str) and _FULL_SHA.match(value):
            return value
    return None


def _end_message(end: Mapping[str, Any] | None) -> str | None:
    if not end:
        return None
    for value in (end.get("message"), end.get("summary")):
        if isinstance(value, str) and value:
            return value
    return None


def _num(value: float | int | None) -> float | None:
    """JSON has no NaN: an undefined estimate (no lifetimes yet) becomes null."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _commit(raw: Mapping[str, Any], index: int, repo_url: str) -> dict[str, Any]:
    sha = str(raw.get("sha", ""))
    subject = str(raw.get("subject", "") or "")
    pr = raw.get("pr")
    match = _PR_IN_SUBJECT.search(subject)
    if pr in (None, "") and match:
        pr = match.group(1)
    digits = "" if pr is None else str(pr).lstrip("#")
    pr_number = int(digits) if digits.isdigit() else None
    if match and pr_number is not None and int(match.group(1)) == pr_number:
        subject = subject[: match.start()]  # the PR is linked separately
    return {
        "index": index,
        "sha": sha,
        "short": sha[:SHORT],
        "subject": subject.strip(),
        "pr": pr_number,
        "tags": list(raw.get("tags") or []),
        "commit_url": f"{repo_url}/commit/{sha}",
        "pr_url": f"{repo_url}/pull/{pr_number}" if pr_number is not None else None,
    }


def _lookup(by_sha: Mapping[str, dict[str, Any]], sha: str, repo_url: str) -> dict[str, Any]:
    if sha in by_sha:
        return by_sha[sha]
    matches = [c for s, c in by_sha.items() if s.startswith(sha)] if sha else []
    if len(matches) == 1:
        return matches[0]
    return _commit({"sha": sha}, -1, repo_url)


def _index_of(entry: Mapping[str, Any], commits: Sequence[Mapping[str, Any]]) -> int:
    pos = entry.get("position")
    sha = str(entry.get("commit", ""))
    if isinstance(pos, int) and 0 <= pos < len(commits) and (
        not sha or commits[pos]["sha"] == sha
    ):
        return pos
    for c in commits:
        if sha and c["sha"] == sha:
            return int(c["index"])
    return -1


def _max(values: Sequence[Any]) -> Any:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return max(nums) if nums else None


def _min(values: Sequence[Any]) -> Any:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return min(nums) if nums else None


def _delta(detail: Mapping[str, Any]) -> float | None:
    """The largest difference one lifetime saw: server probe logprobs, or op probe outputs."""
    if isinstance(detail.get("max_abs_logprob_delta"), int | float):
        return float(detail["max_abs_logprob_delta"])
    groups = detail.get("groups")
    if isinstance(groups, list):
        worst = _max([g.get("max_abs_diff") for g in groups if isinstance(g, Mapping)])
        return float(worst) if worst is not None else None
    return None


def _tested(
    contents: JournalContents, commits: Sequence[dict[str, Any]], bad_end: int, good_end: int
) -> list[dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}

    def row(index: int) -> dict[str, Any]:
        if index not in rows:
            c = commits[index]
            role = "bad end" if index == bad_end else "good end" if index == good_end else None
            rows[index] = {
                **{k: c[k] for k in ("index", "sha", "short", "subject", "pr", "commit_url",
                                     "pr_url")},
                "role": role, "lifetimes": 0, "divergent": 0, "clean": 0, "inconclusive": 0,
                "untestable_lifetimes": 0, "untestable": False, "untestable_message": None,
                "distinct_outputs": None, "repeats": None, "max_abs_delta": None,
                "max_coresidency": None, "min_coresidency": None, "target_coresidency": None,
                "_details": [],
            }
        return rows[index]

    for obs in contents.observations:
        index = _index_of(obs, commits)
        if index < 0:
            continue
        r = row(index)
        r["lifetimes"] += 1
        verdict = str(obs.get("verdict", "")).lower()
        key = {"divergent": "divergent", "clean": "clean", "untestable": "untestable_lifetimes"}
        r[key.get(verdict, "inconclusive")] += 1
        detail = obs.get("detail")
        r["_details"].append(detail if isinstance(detail, Mapping) else {})
    for entry in contents.of_type("untestable"):
        index = _index_of(entry, commits)
        if index < 0:
            continue
        r = row(index)
        r["untestable"] = True
        r["untestable_message"] = entry.get("message")

    out = []
    for index in sorted(rows):
        r = rows[index]
        details: list[Mapping[str, Any]] = r.pop("_details")
        with_distinct = [d for d in details if isinstance(d.get("distinct_outputs"), int)]
        if with_distinct:
            worst = max(with_distinct, key=lambda d: d["distinct_outputs"])
            r["distinct_outputs"] = worst["distinct_outputs"]
            r["repeats"] = worst.get("repeats")
        r["max_abs_delta"] = _max([_delta(d) for d in details])
        r["max_coresidency"] = _max([d.get("max_coresidency") for d in details])
        # The lowest repeat peak shows a lifetime whose batch never formed (INCONCLUSIVE).
        peaks = [p for d in details if isinstance(d.get("coresidency_per_repeat"), list)
                 for p in d["coresidency_per_repeat"]]
        r["min_coresidency"] = _min(peaks)
        r["target_coresidency"] = _max([d.get("target_coresidency") for d in details])
        r["verdict"] = _aggregate(r)
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


def _lifetimes(
    contents: JournalContents, commits: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for obs in contents.observations:
        index = _index_of(obs, commits)
        detail = obs.get("detail") if isinstance(obs.get("detail"), Mapping) else {}
        sha = str(obs.get("commit", "")) or (commits[index]["sha"] if index >= 0 else "")
        out.append({
            "seq": obs.get("seq"),
            "lifetime_id": obs.get("lifetime_id"),
            "sha": sha,
            "short": sha[:SHORT],
            "index": index,
            "verdict": str(obs.get("verdict", "")).upper(),
            "message": obs.get("message") or "",
            "duration_s": obs.get("duration_s"),
            "detail": detail,
            "log_tail": (detail or {}).get("log_tail") or "",
        })
    return out


def _untestables(
    contents: JournalContents, commits: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for entry in contents.of_type("untestable"):
        index = _index_of(entry, commits)
        sha = str(entry.get("commit", ""))
        out.append({"sha": sha, "short": sha[:SHORT], "index": index,
                    "message": entry.get("message") or ""})
    return out


_ENV_ORDER = ("gpu", "gpus", "driver", "cuda", "torch", "vllm", "pinned", "pinned_stack",
              "image", "python", "platform", "host", "hostname")


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list | tuple):
        out[prefix] = ", ".join(str(v) for v in value)
    else:
        out[prefix] = value


def _environment(contents: JournalContents) -> dict[str, Any]:
    """All ``environment`` entries merged (a later fact wins), nested keys flattened."""
    merged: dict[str, Any] = {}
    for entry in contents.of_type("environment"):
        facts = {k: v for k, v in entry.items() if k not in ("type", "seq", "time")}
        _flatten("", facts, merged)
    first = [k for k in _ENV_ORDER if k in merged]
    return {k: merged[k] for k in [*first, *sorted(set(merged) - set(first))]}


def _recipe_summary(recipe: Mapping[str, Any]) -> dict[str, Any]:
    runtime = recipe.get("runtime") or {}
    probe = recipe.get("probe") or {}
    artifacts = recipe.get("artifacts") or {}
    search = recipe.get("search") or {}
    kind = probe.get("kind", "server")
    keys: tuple[str, ...]
    if kind == "server":
        keys = ("requests", "fillers", "repeats", "max_tokens", "logprobs", "jitter_ms",
                "target_coresidency", "invariance_env")
    elif kind == "op":
        keys = ("ops", "dtypes", "hidden_sizes", "seeds", "row_counts", "invariance_env")
    else:
        keys = ("command", "timeout_s")
    return {
        "name": recipe.get("name"),
        "source": recipe.get("source"),
        "model": runtime.get("model"),
        "weights": runtime.get("weights"),
        "backend": runtime.get("backend"),
        "image": runtime.get("image"),
        "env": dict(runtime.get("env") or {}),
        "server_args": list(runtime.get("server_args") or []),
        "swap_set": list(artifacts.get("swap_set") or []),
        "paths": list((recipe.get("range") or {}).get("paths") or []),
        "probe": {"kind": kind, **{k: probe[k] for k in keys if k in probe}},
        "confidence": search.get("confidence"),
    }


def _controls(contents: JournalContents) -> dict[str, Any] | None:
    entries = contents.of_type("controls")
    if not entries:
        return None
    last = entries[-1]

    def side(value: Any) -> dict[str, Any]:
        value = value if isinstance(value, Mapping) else {}
        return {"verdict": str(value.get("verdict", "missing")).upper(),
                "message": value.get("message") or ""}

    positive, negative = side(last.get("positive")), side(last.get("negative"))
    return {
        "ok": bool(last.get("ok", positive["verdict"] == "DIVERGENT"
                            and negative["verdict"] == "CLEAN")),
        "problem": last.get("problem") or "",
        "positive": positive,
        "negative": negative,
        "positive_diverged": positive["verdict"] == "DIVERGENT",
        "negative_clean": negative["verdict"] == "CLEAN",
    }


def _command(command: Any) -> str | None:
    if isinstance(command, list | tuple) and command:
        return shlex.join(str(a) for a in command)
    if isinstance(command, str) and command:
        return command
    return None


# ---------------------------------------------------------------------------------------------
# Markdown

"""`bisect report`: a paste-ready Markdown report, the same content as JSON, and a posterior plot.

Pure: the inputs are a journal's contents and a :class:`SearchState` (the strategy's summary
after replaying that journal); no git, no network. ``build_report`` gathers everything into one
JSON-serialisable dict; ``render_markdown`` and ``render_json`` only format that dict, so the two
outputs cannot disagree. The shape follows cargo-bisect-rustc's issue reports: the answer first,
then the range and environment, and the long parts (lifetimes, log tails, the reproduce command)
folded into ``<details>``.

Header keys read (others are ignored): ``candidates`` (``{sha, subject, pr, tags}``, old end
first), ``direction``, ``good_ref``/``bad_ref`` (as typed), ``good``/``bad`` (full SHAs; or
``good_sha``/``bad_sha``), ``recipe`` (``Recipe.to_dict()``), ``tool_version``, ``command`` (argv
list or string), ``session``. The last ``end`` entry's ``message`` explains a stop.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool.errors import StateError
from bisect_tool.journal import JournalContents
from bisect_tool.probes.render import render_op_detail, render_server_detail

REPORT_VERSION = 1
DEFAULT_REPO_URL = "https://github.com/vllm-project/vllm"
SHORT = 7
_PR_IN_SUBJECT = re.compile(r"\s*\(#(\d+)\)\s*$")
_CREDIBLE_SHOWN = 8  # credible-set commits listed inline in a one-liner before "and N more"


@dataclass(frozen=True)
class SearchState:
    """Where the search stands after replaying the journal (the lead computes it)."""

    state: str  # running, done, bad_end_never_reproduced, budget_exhausted, no_candidate_left,
    #             aborted, controls_failed
    direction: str  # "regression" | "fix"
    flip_block: tuple[str, ...]  # full SHAs (one unless untestables surround the flip)
    confidence: float
    credible_set: tuple[str, ...]  # SHAs holding 90% of the mass
    p_median: float
    p_interval: tuple[float, float]
    q_median: float
    q_interval: tuple[float, float]
    evaluations: int
    candidates_tested: int
    posterior: tuple[float, ...]  # P(flip at candidate i), aligned with header["candidates"]


# ---------------------------------------------------------------------------------------------
# building the dict


def build_report(
    contents: JournalContents,
    state: SearchState,
    *,
    repo_url: str | None = None,
) -> dict[str, Any]:
    """Everything the Markdown shows, as plain JSON values.

    Links go to ``repo_url``, else the header's ``repo_url`` (the clone's own GitHub vLLM remote,
    recorded at start; "" = no links), else vLLM's repository (journals from before that key)."""
    header = contents.header
    if repo_url is None:
        repo_url = str(header.get("repo_url", DEFAULT_REPO_URL))
    repo_url = repo_url.rstrip("/")
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
            "compare_url": f"{repo_url}/compare/{commits[0]['sha']}...{commits[last]['sha']}"
            if repo_url
            else None,
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
        "run_command": header.get("run_command") or None,
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
        "commit_url": f"{repo_url}/commit/{sha}" if repo_url else None,
        "pr_url": f"{repo_url}/pull/{pr_number}" if pr_number is not None and repo_url else None,
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
        return _max([g.get("max_abs_diff") for g in groups if isinstance(g, Mapping)])
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
    """The candidate's verdict over its lifetimes (what a reader of the table expects)."""
    # The same rule as the search (bisect_tool.session.State.apply): any divergent lifetime is
    # evidence of the bug; a candidate is untestable only when nothing conclusive came first.
    if r["divergent"]:
        return "DIVERGENT"
    if r["clean"]:
        return "CLEAN"
    if r["untestable"] or r["untestable_lifetimes"]:
        return "UNTESTABLE"
    return "INCONCLUSIVE"


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


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    digits = 1
    while digits < 4 and x < 1 and round(x * 100, digits) >= 100:
        digits += 1  # 0.9997 must not print as 100.0%
    return f"{x * 100:.{digits}f}%"


def _f2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _link(c: Mapping[str, Any], with_subject: bool = True) -> str:
    out = _short_link(c["short"], c.get("commit_url"))
    if with_subject and c.get("subject"):
        out += f" {_esc(c['subject'])}"
    if c.get("pr_url"):
        out += f" ([#{c['pr']}]({c['pr_url']}))"
    return out


def _short_link(short: str, url: str | None) -> str:
    return f"[{_code(short)}]({url})" if url else _code(short)


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


def _answer_lines(report: Mapping[str, Any]) -> list[str]:
    a = report["answer"]
    label = "First good commit" if a["direction"] == "fix" else "First bad commit"
    kind = f"**{label}** ({a['direction']})"
    block = a["flip_block"]
    state = a["state"]
    done_line: list[str]
    if len(block) == 1:
        done_line = [f"{kind}: {_link(block[0])} — {_estimates(a)}"]
    elif block:
        # As `git bisect` says when skipped commits surround the flip.
        done_line = [f"{kind} could be any of these {len(block)} commits (the ones between "
                     f"could not be tested) — {_estimates(a)}:", ""]
        done_line += [f"- {_link(c)}" for c in block]
    else:
        done_line = [f"{kind}: none found — {_estimates(a)}"]
    credible = _shas(a["credible_set"]) or "empty"
    end_message = a.get("end_message")
    reason = f" ({_esc(end_message)})" if end_message else ""
    controls = report.get("controls") or {}
    if state == "done":
        return done_line
    if state == "bad_end_never_reproduced":
        rng = report["range"]
        ref = f"{_code(rng['bad_ref'])} " if rng.get("bad_ref") else ""
        return [f"**Nothing to bisect**: the bad end ({ref}{_code(rng['bad_sha'][:SHORT])}) "
                f"never showed the bug in {a['bad_end_lifetimes']} lifetimes{reason}. Check "
                "the recipe reproduces it there (controls, co-residency, jitter) before "
                "bisecting."]
    if state == "controls_failed":
        problem = controls.get("problem") or "the positive or negative control did not hold"
        return [f"**Controls failed**: {_esc(problem)}. CLEAN results are not trusted, so "
                "no commit is named."]
    if state == "budget_exhausted":
        head = (f"**Inconclusive: budget exhausted** after {a['evaluations']} lifetimes{reason}; "
                f"the 90% credible set is {credible}. Best guess so far:")
    elif state == "no_candidate_left":
        head = (f"**Inconclusive: no testable candidate left**{reason}; the 90% credible set "
                f"is {credible}. Best guess so far:")
    elif state == "aborted":
        head = (f"**Aborted** after {a['evaluations']} lifetimes{reason}; the 90% credible set "
                f"is {credible}. Best guess so far:")
    elif state == "running":
        head = (f"**Still running** ({a['evaluations']} lifetimes so far); the 90% credible set "
                f"is {credible}. Best guess so far:")
    else:
        head = f"**State: {_esc(state)}**{reason}. Best guess so far:"
    return [head, "", *done_line]


def _env_line(report: Mapping[str, Any]) -> str:
    env = report.get("environment") or {}
    if not env:
        return "- Environment: not recorded"
    return "- Environment: " + "; ".join(f"{_esc(k)} {_code(v)}" for k, v in env.items())


def _recipe_line(report: Mapping[str, Any]) -> str:
    r = report.get("recipe") or {}
    if report.get("run_command"):  # --run: no recipe; the probe is the user's command
        return f"- Probe: `--run` {_code(report['run_command'])} (exit codes as git bisect run)"
    parts = [f"recipe {_code(r.get('name') or '?')}"]
    if r.get("model"):
        parts.append(f"model {_code(r['model'])}"
                     + (f" (weights {_code(r['weights'])})" if r.get("weights") else ""))
    if r.get("image"):
        parts.append(f"image {_code(r['image'])}")
    if r.get("env"):
        parts.append("env " + " ".join(_code(f"{k}={v}") for k, v in r["env"].items()))
    if r.get("server_args"):
        parts.append(f"server args {_code(shlex.join(r['server_args']))}")
    if r.get("swap_set"):
        parts.append("swap set " + ", ".join(_code(s) for s in r["swap_set"]))
    probe = dict(r.get("probe") or {})
    kind = probe.pop("kind", "?")
    if probe:
        parts.append(f"probe {_code(kind)}: " + ", ".join(
            f"{k.replace('_', ' ')} {_code(json.dumps(v) if isinstance(v, list) else v)}"
            for k, v in probe.items()))
    return "- Recipe: " + "; ".join(parts)


def _range_line(report: Mapping[str, Any]) -> str:
    rng = report["range"]
    url = report["repo_url"]

    def end(ref: Any, sha: str, label: str) -> str:
        sha_link = _short_link(sha[:SHORT], f"{url}/commit/{sha}" if url else None)
        return f"{label} {_code(ref)} ({sha_link})" if ref else f"{label} {sha_link}"

    goal = "first good commit" if rng["direction"] == "fix" else "first bad commit"
    return (f"- Range: {end(rng.get('good_ref'), rng['good_sha'], 'good')}, "
            f"{end(rng.get('bad_ref'), rng['bad_sha'], 'bad')}; {rng['direction']} (looking "
            f"for the {goal}); {rng['candidates']} candidates, ends included"
            + (f" ([compare]({rng['compare_url']}))" if rng.get("compare_url") else ""))


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


def _table(report: Mapping[str, Any]) -> list[str]:
    delta_name = "Max abs diff" if report.get("probe_kind") == "op" else "Max abs Δ logprob"
    head = ["#", "Commit", "PR", "Lifetimes", "Divergent", "Distinct outputs", delta_name,
            "Co-residency", "Verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["tested"]:
        pos = str(r["index"]) + (f" ({r['role']})" if r["role"] else "")
        distinct = "-" if r["distinct_outputs"] is None else (
            f"{r['distinct_outputs']}/{r['repeats']}" if r["repeats"]
            else str(r["distinct_outputs"]))
        cores = "-"
        if r["max_coresidency"] is not None:
            low = r.get("min_coresidency")
            cores = (f"{low}–{r['max_coresidency']}" if low is not None
                     and low != r["max_coresidency"] else str(r["max_coresidency"]))
            if r["target_coresidency"]:
                cores += f"/{r['target_coresidency']}"
        cells = [pos, _short_link(r["short"], r.get("commit_url")), _pr_cell(r),
                 str(r["lifetimes"]), str(r["divergent"]), distinct,
                 _delta_cell(r["max_abs_delta"]), cores, f"**{r['verdict']}**"]
        lines.append("| " + " | ".join(cells) + " |")
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
    """The report for an issue: the answer, the setup, the table; the rest in ``<details>``.

    ``plot`` (or ``report["plot"]``): a PNG written by :func:`plot_posterior`; without one the
    text plot is shown instead.
    """
    plot = plot if plot is not None else report.get("plot")
    lines: list[str] = ["## Bisect result", "", *_answer_lines(report), ""]
    a = report["answer"]
    if a["state"] not in ("bad_end_never_reproduced", "controls_failed") and (
        a.get("q_median") is not None
    ):
        lines += [f"{a['evaluations']} lifetimes on {a['candidates_tested']} candidates; "
                  f"false-alarm rate q = {_f2(a['q_median'])} [{_f2(a['q_interval'][0])}, "
                  f"{_f2(a['q_interval'][1])}].", ""]
    version = report.get("tool_version")
    lines += ["### Setup", "", _range_line(report), _env_line(report), _recipe_line(report),
              f"- Tool: bisect {_code(version or 'unknown')}", "", "### Controls", "",
              *_controls_lines(report), "", "### Tested candidates", ""]
    if report["tested"]:
        lines += _table(report)
    else:
        lines.append("No candidate was tested.")
    lines += ["", "### Details", "", *_candidate_details(report)]
    if report.get("reproduce"):
        lines += _details("Command to reproduce", [_fence(report["reproduce"], "sh")])
    if plot:
        posterior = [f"![posterior over the range]({Path(plot).as_posix()})"]
    else:
        posterior = [_fence(text_plot(report), "text")]
    lines += _details("Posterior over the range", posterior)
    return "\n".join(lines).rstrip() + "\n"


def render_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n"


# ---------------------------------------------------------------------------------------------
# plots

_LEVELS = " .:-=+*#%@"
_MARKS = {"DIVERGENT": "X", "CLEAN": "o", "UNTESTABLE": "u", "INCONCLUSIVE": "?"}
_MARK_RANK = {"X": 4, "?": 3, "o": 2, "u": 1, " ": 0}


def text_plot(report: Mapping[str, Any], width: int = 64) -> str:
    """An ASCII sparkline of the posterior (binned to ``width``) over the tested positions.

    Row 1: posterior mass per bin, scaled to the largest bin. Row 2: what was seen in the bin
    (X divergent, o clean, ? inconclusive, u untestable). Then the top commits with bars.
    """
    posterior: list[float] = [float(x or 0.0) for x in report["posterior"]]
    n = len(posterior)
    cols = min(n, width)
    bins = [0.0] * cols
    marks = [" "] * cols
    for i, mass in enumerate(posterior):
        bins[i * cols // n] += mass
    for r in report["tested"]:
        col = r["index"] * cols // n
        mark = _MARKS.get(r["verdict"], "?")
        if _MARK_RANK[mark] > _MARK_RANK[marks[col]]:
            marks[col] = mark
    top = max(bins) or 1.0
    spark = "".join(
        " " if b <= 0 else _LEVELS[max(1, round(b / top * (len(_LEVELS) - 1)))] for b in bins
    )
    commits = report["commits"]
    left, right = f"^{commits[0]['short']} (old end)", f"{commits[-1]['short']} (new end)^"
    lines = [
        f"posterior |{spark}|",
        f"tested    |{''.join(marks)}|",
        f"           {left}{' ' * max(2, cols - len(left) - len(right))}{right}",
        "           X divergent  o clean  ? inconclusive  u untestable",
        "",
    ]
    ranked = sorted(range(n), key=lambda i: -posterior[i])[:5]
    for i in ranked:
        if posterior[i] <= 0:
            break
        bar = "#" * max(1, round(posterior[i] * 40))
        lines.append(f"{commits[i]['short']} #{i:<4} {posterior[i] * 100:6.2f}% {bar}")
    return "\n".join(lines).rstrip()


def plot_posterior(report: Mapping[str, Any], path: Path) -> Path | None:
    """A PNG of the posterior over the range and the evaluations made; None without matplotlib.

    Uses the Agg canvas directly (no pyplot): no global backend switch, no display needed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    posterior = [float(x or 0.0) for x in report["posterior"]]
    n = len(posterior)
    xs = list(range(n))
    fig = Figure(figsize=(10, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    block = {c["index"] for c in report["answer"]["flip_block"]}
    colors = ["tab:red" if i in block else "tab:blue" for i in xs]
    top.bar(xs, posterior, width=1.0, color=colors)
    top.set_ylabel("P(flip at commit)")
    top.set_ylim(0, max(1e-9, max(posterior)) * 1.1)
    a = report["answer"]
    label = "first good" if a["direction"] == "fix" else "first bad"
    title = f"{a['state']}: {label} " + ", ".join(c["short"] for c in a["flip_block"])
    top.set_title(f"{title} (confidence {_pct(a['confidence'])})")
    tested = report["tested"]
    idx = [r["index"] for r in tested]
    bottom.bar(idx, [r["lifetimes"] for r in tested], width=0.8, color="lightgray",
               label="lifetimes")
    bottom.bar(idx, [r["divergent"] for r in tested], width=0.8, color="tab:red",
               label="divergent")
    for r in tested:
        if r["lifetimes"]:
            bottom.annotate(f"{r['divergent']}/{r['lifetimes']}", (r["index"], r["lifetimes"]),
                            ha="center", va="bottom", fontsize=7)
    untestable = [r["index"] for r in tested if r["verdict"] == "UNTESTABLE"]
    if untestable:
        bottom.scatter(untestable, [0.0] * len(untestable), marker="x", color="black",
                       label="untestable", zorder=3)
    bottom.set_ylabel("lifetimes")
    bottom.set_xlabel(f"candidate index (0 = {report['commits'][0]['short']}, old end)")
    bottom.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path

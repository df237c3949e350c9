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

import json as _json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bisect_tool.errors import StateError
from bisect_tool.journal import JournalContents
from bisect_tool.values import SearchState, Verdict
from bisect_tool.verdict import aggregate

REPORT_VERSION = 2
SHORT = 7
VLLM_URL = "https://github.com/vllm-project/vllm"
#: below this many candidates a posterior plot shows nothing a table does not
PLOT_MIN_CANDIDATES = 8
#: PRs listed in the headline's "changes in the range" before "and N more"
PRS_SHOWN = 30
_VLLM_REMOTE = re.compile(r"^(https?://|ssh://git@|git@)github\.com[:/]vllm-project/vllm(\.git)?/?$")
# uvicorn's access log ("127.0.0.1:36066 - "POST /v1/completions HTTP/1.1" 200 OK"): the
# lifetime's log tail keeps the engine's configuration lines and errors, not the requests
_ACCESS_LOG = re.compile(r'"(GET|POST|PUT|DELETE|HEAD|OPTIONS) \S+ HTTP/[\d.]+" \d{3}')
_RELEASE_TAG = re.compile(r"^v?\d+\.\d+\.\d+([.-]?post\d+)?$")
_PR_IN_SUBJECT = re.compile(r"\s*\(#(\d+)\)\s*$")

# ---------------------------------------------------------------------------------------------
# building the dict


def build_report(
    contents: JournalContents,
    state: SearchState,
    *,
    repo_url: str | None = None,
    bundled_recipe: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the Markdown shows, as plain JSON values.

    ``repo_url``: where commit links point; by default the vLLM repository when the journal's
    clone has it as its remote (``header["remote_url"]``), else no commit links at all (a SHA
    of a fork or a stand-in repository would 404 there). ``bundled_recipe``: the bundled recipe
    of the same name, so the reproduce section lists only the values this run changed.
    """
    header = contents.header
    if repo_url is None:
        if "repo_url" in header:  # the link base recorded at start (remote.clone_link_base)
            repo_url = str(header.get("repo_url") or "")
        else:
            repo_url = VLLM_URL if is_vllm_remote(str(header.get("remote_url") or "")) else ""
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

    tiers = _tiers(contents, commits, state.tiers)
    everything, contents = contents, _faithful_view(contents)
    tested = _tested(contents, commits, bad_end, good_end)
    recipe = header.get("recipe") or {}
    probe_kind = str((recipe.get("probe") or {}).get("kind", "server"))
    bad_end_lifetimes = next((t["lifetimes"] for t in tested if t["index"] == bad_end), 0)
    lifetimes = _lifetimes(contents, commits)
    environment = _environment(contents)
    rng = _range_facts(header, commits, good_end, bad_end, direction, repo_url, recipe)
    answer = {
        "state": state.state,
        "direction": direction,
        "flip_block": [_lookup(by_sha, s, repo_url) for s in state.flip_block],
        "confidence": _num(state.confidence),
        "good_end_doubt": _num(state.good_end_doubt),
        "bad_end_doubt": _num(state.bad_end_doubt),
        "credible_set": [_lookup(by_sha, s, repo_url) for s in state.credible_set],
        "p_median": _num(state.p_median),
        "p_interval": [_num(x) for x in state.p_interval],
        "q_median": _num(state.q_median),
        "q_interval": [_num(x) for x in state.q_interval],
        "evaluations": state.evaluations,
        "candidates_tested": state.candidates_tested,
        "bad_end_lifetimes": bad_end_lifetimes,
        "end_message": _end_message(everything.end),
    }
    controls = _controls(contents)
    return {
        "report_version": REPORT_VERSION,
        "repo_url": repo_url,
        "session": header.get("session") or header.get("session_id"),
        "tool_version": header.get("tool_version"),
        "started": header.get("started"),
        "answer": answer,
        "headline": _headline(answer, rng, commits, recipe, environment),
        "rests_on": _rests_on(tested, good_end, bad_end, controls),
        "tiers": tiers,
        "releases": _releases(header, commits, answer, recipe, bundled_recipe),
        "previous": dict(header["previous"]) if isinstance(header.get("previous"), Mapping)
        else None,
        "range": rng,
        "prs": _prs(commits, rng, repo_url),
        "environment": environment,
        "environment_block": _environment_block(environment, recipe, tested),
        "recipe": _recipe_summary(recipe),
        "probe_kind": probe_kind,
        "controls": controls,
        "tested": tested,
        "lifetimes": lifetimes,
        "symptom": _symptom(recipe, tested, bad_end),
        "untestable": _untestables(contents, commits),
        "posterior": [_num(x) or 0.0 for x in state.posterior],
        "show_plot": len(commits) >= PLOT_MIN_CANDIDATES,
        "rates": _rates(answer, tested, bad_end, good_end),
        "commits": [{k: c[k] for k in ("sha", "short", "subject", "pr")} for c in commits],
        "reproduce": _command(header.get("command")),
        "run_command": header.get("run_command") or None,
        "reproduce_recipe": _recipe_changes(recipe, bundled_recipe),
        "reproduce_lifetime": _lifetime_commands(recipe),
        "plot": None,
    }


_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")


def short_ref(sha: str) -> str:
    """A commit by its first SHORT hex digits; a release id (``vllm-0.26.0``) whole."""
    return sha[:SHORT] if _HEX.match(sha) else sha


def _releases(
    header: Mapping[str, Any],
    commits: Sequence[Mapping[str, Any]],
    answer: Mapping[str, Any],
    recipe: Mapping[str, Any],
    bundled_recipe: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """A release-level run: where the releases were listed, which were left out and why, and
    the next step, the commits between the two releases it ended between, as a command."""
    if header.get("level") != "release":
        return None
    paths = [str(x) for x in (recipe.get("range") or {}).get("paths") or []]
    name = str(recipe.get("name") or "")
    recipe_arg = name if bundled_recipe else str(recipe.get("source") or name)
    next_step = None
    block = answer.get("flip_block") or []
    if answer.get("state") == "done" and block:
        first = int(block[0]["index"])
        old, new = commits[first - 1] if first > 0 else None, commits[int(block[-1]["index"])]
        tag = str((recipe.get("range") or {}).get("release_tag") or "v{version}")

        def ref(c: Mapping[str, Any]) -> str:
            tags = [str(t) for t in c.get("tags") or []]
            return tags[0] if tags else tag.format(version=str(c["sha"]).rsplit("-", 1)[-1])

        if old is not None:
            fix = answer.get("direction") == "fix"
            good, bad = (ref(new), ref(old)) if fix else (ref(old), ref(new))
            next_step = {
                "old": ref(old), "new": ref(new), "paths": paths,
                "command": shlex.join(["bisect", "start", "--good", good, "--bad", bad,
                                       "--recipe", recipe_arg]),
            }
    return {
        "package": header.get("package"),
        "index_url": header.get("index_url"),
        "listing_source": header.get("listing_source"),
        "listing_note": header.get("listing_note") or None,
        "left_out": [{"version": str(v), "why": str(w)} for v, w in header.get("left_out") or []],
        "next_step": next_step,
    }


def _faithful_view(contents: JournalContents) -> JournalContents:
    """The journal without the fast probe's runs: the evidence table, the rates and the ends
    are the faithful probe's (the tiers section shows the fast probe's)."""
    return JournalContents(
        contents.header,
        tuple(e for e in contents.entries
              if not (e.get("type") == "observation" and e.get("tier") == "narrow")),
        contents.torn_tail,
    )


def _tiers(
    contents: JournalContents,
    commits: Sequence[Mapping[str, Any]],
    state_tiers: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """The tiered search: what the fast probe saw per candidate, the phases with their one-line
    reasons, and the confirm step's two candidates with their faithful lifetimes."""
    if not state_tiers:
        return None
    rows: dict[int, dict[str, Any]] = {}
    faithful: dict[int, list[int]] = {}
    for obs in contents.observations:
        index = _index_of(obs, commits)
        if index < 0:
            continue
        verdict = str(obs.get("verdict", "")).lower()
        if obs.get("tier") != "narrow":
            counts = faithful.setdefault(index, [0, 0])
            counts[0] += 1
            counts[1] += verdict == "divergent"
            continue
        c = commits[index]
        row = rows.setdefault(index, {
            "index": index, "short": c["short"], "name": _name(c), "subject": c["subject"],
            "commit_url": c.get("commit_url"), "runs": 0, "divergent": 0, "clean": 0,
            "untestable": 0, "message": "", "gate": None,
        })
        row["runs"] += 1
        key = verdict if verdict in ("divergent", "clean") else "untestable"
        row[key] += 1
        row["message"] = str(obs.get("message") or "")
        detail = obs.get("detail") if isinstance(obs.get("detail"), Mapping) else {}
        if isinstance(detail, Mapping) and detail.get("gate") is not None:
            row["gate"] = str(detail["gate"])
    for row in rows.values():
        row["verdict"] = ("DIVERGENT" if row["divergent"] else "CLEAN" if row["clean"]
                          else "UNTESTABLE")
    sides = None
    if state_tiers.get("sides"):
        bad, good = (int(x) for x in state_tiers["sides"])

        def side(i: int) -> dict[str, Any]:
            n, d = faithful.get(i, [0, 0])
            c = commits[i]
            return {"index": i, "short": c["short"], "name": _name(c),
                    "commit_url": c.get("commit_url"), "lifetimes": n, "divergent": d}

        sides = {"bad": side(bad), "good": side(good)}
    flip = str(state_tiers.get("narrow_flip") or "")
    by_sha = {c["sha"]: c for c in commits}
    return {
        "kind": state_tiers.get("kind"),
        "phase": state_tiers.get("phase"),
        "narrow_flip": _name(by_sha[flip]) if flip in by_sha else short_ref(flip),
        "narrow_confidence": _num(state_tiers.get("narrow_confidence")),
        "narrow_runs": state_tiers.get("narrow_runs"),
        "narrow_candidates": len(rows),
        "faithful_lifetimes": state_tiers.get("faithful_lifetimes"),
        "stand_in_prior": _num(state_tiers.get("stand_in_prior")),
        "stand_in_probability": _num(state_tiers.get("stand_in_probability")),
        "sides": sides,
        "phases": [{"phase": str(e.get("phase")), "message": str(e.get("message") or "")}
                   for e in contents.of_type("phase")],
        "narrow": [rows[i] for i in sorted(rows)],
        "gate_rejected": [{"name": r["name"], "gate": r["gate"]} for i, r in sorted(rows.items())
                          if r["gate"] not in (None, "ok")],
    }


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
        "short": short_ref(sha),
        "subject": subject.strip(),
        "pr": pr_number,
        "tags": list(raw.get("tags") or []),
        "commit_url": f"{repo_url}/commit/{sha}" if repo_url else None,
        "pr_url": f"{repo_url}/pull/{pr_number}" if repo_url and pr_number is not None else None,
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
        r["swap_sha256"] = {
            str(k): str(v)
            for d in details
            if isinstance(d.get("swap_sha256"), Mapping)
            for k, v in d["swap_sha256"].items()
        }
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
            "short": short_ref(sha),
            "index": index,
            "verdict": str(obs.get("verdict", "")).upper(),
            "message": obs.get("message") or "",
            "duration_s": obs.get("duration_s"),
            "detail": detail,
            "log_tail": quiet_log((detail or {}).get("log_tail") or ""),
            "coresidency": _max([(detail or {}).get("max_coresidency")]),
            "target": (detail or {}).get("target_coresidency"),
            "distinct_outputs": (detail or {}).get("distinct_outputs"),
            "repeats": (detail or {}).get("repeats"),
            "max_abs_delta": _delta(detail or {}),
            "first_divergent_position": (detail or {}).get("first_divergent_position"),
            "moved": _moved(detail or {}),
        })
    return out


def _untestables(
    contents: JournalContents, commits: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for entry in contents.of_type("untestable"):
        index = _index_of(entry, commits)
        sha = str(entry.get("commit", ""))
        out.append({"sha": sha, "short": short_ref(sha), "index": index,
                    "name": _name(commits[index]) if index >= 0 else short_ref(sha),
                    "message": entry.get("message") or ""})
    # Candidates whose every lifetime was UNTESTABLE (no artifact, a failed build, the gate
    # rejecting its extension, a server that never booted): why, in the lifetime's own words.
    listed = {u["sha"] for u in out}
    by_index: dict[int, list[Mapping[str, Any]]] = {}
    for obs in contents.observations:
        index = _index_of(obs, commits)
        if index >= 0:
            by_index.setdefault(index, []).append(obs)
    for index, seen in sorted(by_index.items()):
        sha = commits[index]["sha"]
        if sha in listed or any(str(o.get("verdict")) != "untestable" for o in seen):
            continue
        out.append({"sha": sha, "short": short_ref(sha), "index": index,
                    "name": _name(commits[index]), "message": str(seen[-1].get("message") or ""),
                    "lifetimes": len(seen)})
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
        keys = ("ops", "dtypes", "hidden_sizes", "seeds", "row_counts", "op_abi",
                "invariance_env")
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


def is_vllm_remote(url: str) -> bool:
    """Whether a clone's remote URL is the vLLM repository on GitHub."""
    return bool(_VLLM_REMOTE.match(url.strip()))


def quiet_log(text: str) -> str:
    """A log tail without HTTP access-log lines (the engine's config lines and errors stay)."""
    return "\n".join(line for line in text.splitlines() if not _ACCESS_LOG.search(line))


def _moved(detail: Mapping[str, Any]) -> str | None:
    if "tokens_moved" not in detail:
        return None
    if not detail.get("distinct_outputs") or detail.get("distinct_outputs") == 1:
        return "nothing"
    return "tokens" if detail.get("tokens_moved") else "logprobs only"


def _range_facts(
    header: Mapping[str, Any],
    commits: Sequence[Mapping[str, Any]],
    good_end: int,
    bad_end: int,
    direction: str,
    repo_url: str,
    recipe: Mapping[str, Any],
) -> dict[str, Any]:
    good_ref, bad_ref = _ref(header, "good"), _ref(header, "bad")
    last = len(commits) - 1
    old_ref, new_ref = (bad_ref, good_ref) if direction == "fix" else (good_ref, bad_ref)
    if header.get("level") == "release":  # versions as typed: the releases' tags link
        old_ref, new_ref = _name(commits[0]), _name(commits[last])
    # Only a recipe run is known to be on vLLM's history (a --run bisect may be any project).
    package = str((recipe.get("artifacts") or {}).get("package") or "")
    compare_url = None
    if repo_url:
        compare_url = f"{repo_url}/compare/{commits[0]['sha']}...{commits[last]['sha']}"
    elif (
        package == "vllm"
        and old_ref
        and new_ref
        and _RELEASE_TAG.match(old_ref)
        and _RELEASE_TAG.match(new_ref)
    ):
        # Release tags name the same commits in vLLM's own repository whatever clone ran this.
        compare_url = f"{VLLM_URL}/compare/{old_ref}...{new_ref}"
    level = str(header.get("level") or "commit")
    return {
        "good_ref": good_ref,
        "good_sha": _sha(header, "good") or commits[good_end]["sha"],
        "bad_ref": bad_ref,
        "bad_sha": _sha(header, "bad") or commits[bad_end]["sha"],
        "direction": direction,
        "level": level,
        "candidates": len(commits),
        "paths": list(header.get("paths") or []),
        "old_end": commits[0]["sha"],
        "new_end": commits[last]["sha"],
        "good_end_index": good_end,
        "bad_end_index": bad_end,
        "compare_url": compare_url,
        "remote_url": str(header.get("remote_url") or ""),
    }


def _name(c: Mapping[str, Any]) -> str:
    """A commit as a maintainer names it: its release tag, else its short SHA."""
    tags = [t for t in c.get("tags") or [] if _RELEASE_TAG.match(str(t))]
    return str(tags[0]) if tags else str(c.get("short") or "?")


def _headline(
    answer: Mapping[str, Any],
    rng: Mapping[str, Any],
    commits: Sequence[Mapping[str, Any]],
    recipe: Mapping[str, Any],
    environment: Mapping[str, Any],
) -> dict[str, Any]:
    """The answer in words: what was searched and what was found, for the first lines."""
    block = answer["flip_block"]
    fixed = answer["direction"] == "fix"
    searched = (
        f"{rng['bad_ref'] or short_ref(rng['bad_sha'])} (bad) .. "
        f"{rng['good_ref'] or short_ref(rng['good_sha'])} (good), {rng['level']} level, "
        f"{rng['candidates']} candidates"
        + (f" touching {', '.join(rng['paths'])}" if rng["paths"] else "")
    )
    words = None
    if answer["state"] == "done" and len(block) == 1:
        flip = block[0]
        verb = "fixed in" if fixed else "broken by"
        words = f"{verb} {_name(flip)}"
        swap = [str(x) for x in (recipe.get("artifacts") or {}).get("swap_set") or []]
        package = str((recipe.get("artifacts") or {}).get("package") or "vllm")
        pinned = (environment.get("pinned_version") or environment.get(f"versions.{package}")
                  or environment.get(package))
        if swap:
            files = ", ".join(f"`{Path(x).name}`" for x in swap)
            other = commits[rng["bad_end_index"]] if fixed else commits[rng["good_end_index"]]
            if pinned:
                python_side = f"{pinned}'s Python"
            elif rng.get("level") == "release":  # its ends are not the pinned stack's release
                python_side = "the pinned stack's Python"
            else:
                python_side = f"{_name(other)}'s Python"
            words += f", in the compiled extension: {_name(flip)}'s {files} under {python_side}"
    elif answer["state"] == "done" and block:
        words = f"{'fixed' if fixed else 'broken'} by one of {len(block)} commits"
    return {"searched": searched, "words": words}


def _rests_on(
    tested: Sequence[Mapping[str, Any]],
    good_end: int,
    bad_end: int,
    controls: Mapping[str, Any] | None,
) -> dict[str, Any]:
    by_index = {int(r["index"]): r for r in tested}

    def counts(i: int) -> dict[str, int]:
        r = by_index.get(i) or {}
        return {"lifetimes": int(r.get("lifetimes", 0)), "divergent": int(r.get("divergent", 0))}

    def stand_in(end: int, other: int) -> dict[str, Any] | None:
        """An untestable end's nearest tested candidate toward the other end (the search
        checked it in the end's place)."""
        row = by_index.get(end)
        if row is None or row.get("verdict") != "UNTESTABLE":
            return None
        step = 1 if other > end else -1
        for i in range(end + step, other + step, step):
            near = by_index.get(i)
            if near is not None and near.get("verdict") != "UNTESTABLE":
                return {"index": i, "name": _name(near), **counts(i)}
        return None

    bad_stand_in, good_stand_in = stand_in(bad_end, good_end), stand_in(good_end, bad_end)
    taken = {good_end, bad_end} | {int(x["index"]) for x in (bad_stand_in, good_stand_in) if x}
    others = [r for r in tested if r["index"] not in taken]
    held = "not run" if controls is None else "held" if controls.get("ok") else "failed"
    return {
        "bad_end": counts(bad_end),
        "good_end": counts(good_end),
        "bad_end_stand_in": bad_stand_in,
        "good_end_stand_in": good_stand_in,
        "other_lifetimes": sum(int(r["lifetimes"]) for r in others),
        "other_candidates": len(others),
        "controls": held,
    }


def _prs(
    commits: Sequence[Mapping[str, Any]], rng: Mapping[str, Any], repo_url: str
) -> dict[str, Any]:
    """The PRs merged in the range (from ``(#NNNNN)`` in subjects), as cargo-bisect-rustc lists
    them. With the range's path filter they are the ones touching the compiled sources."""
    ends = {rng["good_end_index"], rng["bad_end_index"]}
    found = [
        {"pr": c["pr"], "subject": c["subject"], "short": c["short"],
         "url": f"{repo_url}/pull/{c['pr']}" if repo_url and c["pr"] is not None else None}
        for c in commits
        if c["pr"] is not None and (c["index"] not in ends or c["index"] == max(ends))
    ]
    return {
        "filtered_by_paths": bool(rng["paths"]),
        "items": found[:PRS_SHOWN],
        "more": max(0, len(found) - PRS_SHOWN),
    }


def _environment_block(
    environment: Mapping[str, Any],
    recipe: Mapping[str, Any],
    tested: Sequence[Mapping[str, Any]],
) -> list[tuple[str, str]]:
    """(what, value) rows of the environment block, in the order a maintainer reads them."""
    rows: list[tuple[str, str]] = []
    gpu = environment.get("gpu")
    if gpu:
        cc = environment.get("compute_capability")
        rows.append(("GPU", f"{gpu}" + (f" (compute capability {cc})" if cc else "")))
    for key, label in (("driver", "Driver"), ("cuda", "CUDA"), ("torch", "PyTorch"),
                       ("triton", "Triton"), ("python", "Python")):
        if environment.get(key):
            rows.append((label, str(environment[key])))
    package = str((recipe.get("artifacts") or {}).get("package") or "vllm")
    if environment.get("pinned_version"):
        rows.append((f"Pinned {package} (Python side)", str(environment["pinned_version"])))
    runtime = recipe.get("runtime") or {}
    backend = environment.get("backend") or runtime.get("backend")
    if backend:
        rows.append(("Backend", str(backend) + (f", image {environment['image']}"
                                                if environment.get("image") else "")))
    weights = str(runtime.get("weights") or "")
    if weights.startswith("random"):
        rows.append(("Weights", f"random weights at the config's initializer scale "
                                f"({runtime.get('model') or weights})"))
    elif runtime.get("model"):
        rows.append(("Weights", str(runtime.get("model"))))
    for r in tested:
        for rel, digest in sorted((r.get("swap_sha256") or {}).items()):
            rows.append((f"{Path(rel).name} of {r['short']}", f"sha256 {digest}"))
    return rows


def _symptom(
    recipe: Mapping[str, Any], tested: Sequence[Mapping[str, Any]], bad_end: int
) -> dict[str, Any] | None:
    reported = str((recipe.get("probe") or {}).get("reported_symptom") or "")
    if not reported:
        return None
    bad = next((r for r in tested if r["index"] == bad_end), None)
    what = "the bad end"
    if not (bad and bad["divergent"]):
        # the bad end untested or untestable (a stand-in, the confirm step's bad side): the
        # symptom as the candidate with the most divergent lifetimes showed it
        shown = [r for r in tested if r["divergent"]]
        if shown:
            bad = max(shown, key=lambda r: r["divergent"])
            what = _name(bad)
    seen = None
    if bad and bad["lifetimes"]:
        cores = bad.get("max_coresidency")
        seen = (
            f"{bad['divergent']} of {bad['lifetimes']} lifetimes of {what} divergent"
            + (f", up to {bad['distinct_outputs']} distinct outputs in {bad['repeats']} repeats"
               if bad.get("distinct_outputs") and bad.get("repeats") else "")
            + (f", at co-residency {cores}" if cores is not None else "")
        )
    return {"reported": reported, "seen": seen}


def _rates(
    answer: Mapping[str, Any],
    tested: Sequence[Mapping[str, Any]],
    bad_end: int,
    good_end: int,
) -> dict[str, bool]:
    """Which rate estimates have data behind them (else the report says "prior")."""
    flip: int | None = int(answer["flip_block"][0]["index"]) if answer["flip_block"] else None
    fix = answer["direction"] == "fix"

    def bad_side(i: int) -> bool:
        if flip is None or flip < 0:
            return i == bad_end
        return bool(i < flip) if fix else bool(i >= flip)

    conclusive = [r for r in tested if r["divergent"] or r["clean"]]
    return {
        "p_has_data": any(bad_side(int(r["index"])) for r in conclusive),
        "q_has_data": any(not bad_side(int(r["index"])) for r in conclusive),
    }


def _recipe_changes(
    recipe: Mapping[str, Any], bundled: Mapping[str, Any] | None
) -> list[tuple[str, str]]:
    """``[section] key = value`` lines where this run's recipe differs from the bundled one."""
    out: list[tuple[str, str]] = []
    if not bundled:
        return out
    for section in ("range", "artifacts", "runtime", "probe", "search"):
        mine = recipe.get(section) or {}
        theirs = bundled.get(section) or {}
        if not isinstance(mine, Mapping) or not isinstance(theirs, Mapping):
            continue
        for key in sorted(mine):
            # through JSON: the journal keeps lists where the recipe keeps tuples
            if _json.dumps(mine[key], sort_keys=True) != _json.dumps(
                theirs.get(key), sort_keys=True, default=list
            ):
                out.append((section, f"{key} = {_toml_value(mine[key])}"))
    return out


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def _lifetime_commands(recipe: Mapping[str, Any]) -> dict[str, str] | None:
    """One lifetime by hand: the server command and the probe client, on loopback."""
    runtime = recipe.get("runtime") or {}
    probe = recipe.get("probe") or {}
    module = str(runtime.get("server_module") or "")
    if probe.get("kind", "server") != "server" or not module:
        return None
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (runtime.get("env") or {}).items())
    model = str(runtime.get("model") or "MODEL")
    args = [str(a) for a in runtime.get("server_args") or []]
    if module == "vllm.entrypoints.openai.api_server":
        server = shlex.join(["vllm", "serve", model, *args, "--host", "127.0.0.1", "--port",
                             "8000"])
    else:
        server = shlex.join(["python", "-m", module, "--model", model, *args, "--host",
                             "127.0.0.1", "--port", "8000"])
    name = str(recipe.get("name") or "batch-invariance")
    client = shlex.join(["bisect", "probe", "--server", "http://127.0.0.1:8000", "--recipe",
                         name])
    return {"server": (env + " " if env else "") + server, "client": client}

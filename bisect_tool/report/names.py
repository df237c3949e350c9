"""How the report names things, one way each (issue 32: a release was ``v0.27.0``,
``vllm-0.27.0`` and "vllm 0.27.0" in one report): a candidate by its release tag, else its short
SHA; a share as a percentage a reader can check; links only where they resolve."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.journal.entries import Observed, Refused

SHORT = 7
VLLM_URL = "https://github.com/vllm-project/vllm"
_VLLM_REMOTE = re.compile(r"^(https?://|ssh://git@|git@)github\.com[:/]vllm-project/vllm(\.git)?/?$")
RELEASE_TAG = re.compile(r"^v?\d+\.\d+\.\d+([.-]?post\d+)?$")
_PR_IN_SUBJECT = re.compile(r"\s*\(#(\d+)\)\s*$")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


def short_ref(sha: str) -> str:
    """A commit by its first SHORT hex digits; any other id (a release's) whole."""
    return sha[:SHORT] if _HEX.match(sha) else sha


def is_vllm_remote(url: str) -> bool:
    """Whether a clone's remote URL is the vLLM repository on GitHub."""
    return bool(_VLLM_REMOTE.match(url.strip()))


def release_tag(c: Mapping[str, Any]) -> str | None:
    tags = [str(t) for t in c.get("tags") or [] if RELEASE_TAG.match(str(t))]
    return tags[0] if tags else None


def name(c: Mapping[str, Any]) -> str:
    """A candidate as a maintainer names it: its release tag (v0.27.0), else its short SHA."""
    return release_tag(c) or str(c.get("short") or short_ref(str(c.get("sha") or "")) or "?")


def all_releases(commits: Sequence[Mapping[str, Any]]) -> bool:
    """Every candidate is a release: a release-level run, or a history of one commit per
    release (the GPU records' stand-in repository); the report then says "release"."""
    return bool(commits) and all(release_tag(c) for c in commits)


def num(value: float | int | None) -> float | None:
    """JSON has no NaN: an undefined estimate (no lifetimes yet) becomes null."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def commit_entry(raw: Mapping[str, Any], index: int, repo_url: str) -> dict[str, Any]:
    """A header candidate as the report keeps it: its name, subject without the PR suffix (the
    PR is linked apart), and links where the commit is vLLM's."""
    sha = str(raw.get("sha", ""))
    subject = str(raw.get("subject", "") or "")
    pr = raw.get("pr")
    match = _PR_IN_SUBJECT.search(subject)
    if pr in (None, "") and match:
        pr = match.group(1)
    digits = "" if pr is None else str(pr).lstrip("#")
    pr_number = int(digits) if digits.isdigit() else None
    if match and pr_number is not None and int(match.group(1)) == pr_number:
        subject = subject[: match.start()]
    out: dict[str, Any] = {
        "index": index,
        "sha": sha,
        "short": short_ref(sha),
        "subject": subject.strip(),
        "pr": pr_number,
        "tags": list(raw.get("tags") or []),
        "commit_url": f"{repo_url}/commit/{sha}" if repo_url and FULL_SHA.match(sha) else None,
        "pr_url": f"{repo_url}/pull/{pr_number}" if repo_url and pr_number is not None else None,
        # off the main line: the branch that holds it, the main commit a cherry-pick copies
        # (linked where commits are), the older end a merge base stands in for
        "branch": str(raw.get("branch") or "") or None,
        "picked_from": str(raw.get("picked_from") or "") or None,
        "picked_url": (f"{repo_url}/commit/{raw['picked_from']}" if repo_url
                       and FULL_SHA.match(str(raw.get("picked_from") or "")) else None),
        "stands_for": str(raw.get("stands_for") or "") or None,
    }
    out["name"] = name(out)
    return out


def lookup(by_sha: Mapping[str, dict[str, Any]], sha: str, repo_url: str) -> dict[str, Any]:
    if sha in by_sha:
        return by_sha[sha]
    matches = [c for s, c in by_sha.items() if s.startswith(sha)] if sha else []
    if len(matches) == 1:
        return matches[0]
    return commit_entry({"sha": sha}, -1, repo_url)


def index_of(entry: Observed | Refused, commits: Sequence[Mapping[str, Any]]) -> int:
    """The candidate an entry is about: its position, checked against its commit (a journal
    edited by hand, or a carried entry, may disagree: the commit wins)."""
    pos, sha = entry.position, entry.commit
    if 0 <= pos < len(commits) and (not sha or commits[pos]["sha"] == sha):
        return pos
    for c in commits:
        if sha and c["sha"] == sha:
            return int(c["index"])
    return -1


def lifetime_number(lifetime_id: Any) -> str:
    """A lifetime by its number within its candidate (``vllm-0.26.0-2`` -> ``#2``): the id
    spells the candidate its own way; the journal and the JSON keep it whole."""
    text = str(lifetime_id or "?")
    head, _, tail = text.rpartition("-")
    return f"#{tail}" if head and tail.isdigit() else text


def rename(text: str, commits: Sequence[Mapping[str, Any]]) -> str:
    """A journaled message with every candidate spelled as the report spells it: a release's
    id (``vllm-0.26.0``) and a stand-in commit's SHA (``11c0eb366988``) become its tag."""
    for c in commits:
        tag = release_tag(c)
        sha = str(c.get("sha") or "")
        if not tag or not sha:
            continue
        for spelled in sorted({sha, sha[:12], sha[:SHORT]}, key=len, reverse=True):
            if len(spelled) >= SHORT:
                text = re.sub(rf"(?<![\w.-]){re.escape(spelled)}(?![\w.-]|-\d)", tag, text)
    return text


# Any absolute path of two parts or more, wherever the machine keeps it (a CI runner's checkout
# sits under folders no list of prefixes foresees), except an HTTP route such as /v1/completions.
_PART = r"[^\s:;,'\"()\[\]/]+"
_ABSOLUTE = re.compile(rf"(?<![\w.~:/])/(?!v\d+/){_PART}(?:/{_PART})+/?")


def no_local_paths(text: str) -> str:
    """A journaled message without the paths of the machine that ran it: a lifetime's or a
    build's log as the state dir names it (``logs/build-ab12.log``), any other path by its
    last part (issue 32: a report names no temp folder)."""

    def short(match: re.Match[str]) -> str:
        path = match.group(0)
        if "/logs/" in path:
            return "logs/" + path.rsplit("/logs/", 1)[1]
        return path.rstrip("/").rsplit("/", 1)[-1] or path

    return _ABSOLUTE.sub(short, text)

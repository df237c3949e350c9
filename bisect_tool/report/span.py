"""The report's range: its ends as typed and as SHAs, the candidates, where to compare them;
and for a release-level run, where the releases were listed, which were left out and the next
step in a clone. Pure, as ``facts`` is."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.report import reproduce
from bisect_tool.report.names import FULL_SHA, RELEASE_TAG, VLLM_URL, name


def range_facts(header: Mapping[str, Any], commits: Sequence[Mapping[str, Any]], good_end: int,
                bad_end: int, direction: str, repo_url: str, package: str, noun: str
                ) -> dict[str, Any]:
    last = len(commits) - 1
    good_ref, bad_ref = _ref(header, "good"), _ref(header, "bad")
    if noun == "release":  # one spelling: the releases' tags
        good_ref, bad_ref = name(commits[good_end]), name(commits[bad_end])
    # the ends as typed (release tags name the same commits in vLLM's repository)
    old_ref, new_ref = (bad_ref, good_ref) if direction == "fix" else (good_ref, bad_ref)
    old_ref, new_ref = old_ref or name(commits[0]), new_ref or name(commits[last])
    compare_url = None
    if repo_url:
        compare_url = f"{repo_url}/compare/{commits[0]['sha']}...{commits[last]['sha']}"
    elif package == "vllm" and RELEASE_TAG.match(old_ref) and RELEASE_TAG.match(new_ref):
        # Release tags name the same commits in vLLM's own repository whatever clone ran this.
        compare_url = f"{VLLM_URL}/compare/{old_ref}...{new_ref}"
    return {
        "good_ref": good_ref,
        "good_sha": _sha(header, "good") or commits[good_end]["sha"],
        "bad_ref": bad_ref,
        "bad_sha": _sha(header, "bad") or commits[bad_end]["sha"],
        "direction": direction,
        "level": str(header.get("level") or "commit"),
        "noun": noun,
        "candidates": len(commits),
        "paths": list(header.get("paths") or []),
        "old_end": commits[0]["sha"],
        "new_end": commits[last]["sha"],
        "good_end_index": good_end,
        "bad_end_index": bad_end,
        "compare_url": compare_url,
        "remote_url": str(header.get("remote_url") or ""),
        # the older end's stand-in where the ends are not on one line of history
        "merge_base": str(header.get("merge_base") or "") or None,
        "merge_base_for": commits[0].get("stands_for"),
        "mainline": str(header.get("mainline") or "main").removeprefix("refs/heads/")
        .removeprefix("refs/remotes/"),
    }


def _ref(header: Mapping[str, Any], end: str) -> str | None:
    """The ref as the user typed it: ``good_ref``, or ``good`` when that is not a full SHA."""
    for value in (header.get(f"{end}_ref"), header.get(end)):
        if isinstance(value, str) and value and not FULL_SHA.match(value):
            return value
    return None


def _sha(header: Mapping[str, Any], end: str) -> str | None:
    for value in (header.get(f"{end}_sha"), header.get(end)):
        if isinstance(value, str) and FULL_SHA.match(value):
            return value
    return None


def releases(header: Mapping[str, Any], commits: Sequence[Mapping[str, Any]],
             answer: Mapping[str, Any], recipe: Mapping[str, Any],
             bundled_recipe: Mapping[str, Any] | None, noun: str) -> dict[str, Any] | None:
    """Where the releases were listed, which were left out and why (a release-level run), and
    the next step: the commits between the two releases the answer lies between, in a clone."""
    if noun != "release":
        return None
    paths = [str(x) for x in (recipe.get("range") or {}).get("paths") or []]
    next_step = None
    block = answer.get("flip_block") or []
    if answer.get("state") == "done" and block:
        first = int(block[0]["index"])
        old, new = commits[first - 1] if first > 0 else None, commits[int(block[-1]["index"])]
        if old is not None:
            fix = answer.get("direction") == "fix"
            good, bad = (name(new), name(old)) if fix else (name(old), name(new))
            # the recipe as given, with the sources it had for commits (a release-level run
            # keeps only release wheels: that copy would refuse every commit without a tag)
            sources = [str(s) for s in header.get("commit_sources")
                       or (recipe.get("artifacts") or {}).get("sources") or []]
            for_commits = {**recipe, "artifacts": {**(recipe.get("artifacts") or {}),
                                                   "sources": sources}}
            next_step = {
                "old": name(old), "new": name(new), "paths": paths,
                "command": shlex.join(["bisect", "start", "--good", good, "--bad", bad,
                                       "--recipe",
                                       reproduce.recipe_arg(for_commits, bundled_recipe)]),
                # a commit between two releases has no release wheel: the recipe must name a
                # per-commit source (vLLM's wheel index, or a source build)
                "reaches_commits": bool({"wheel-index", "source-build"} & set(sources)),
            }
    level = header.get("level") == "release"
    return {
        "package": header.get("package") if level else None,
        "index_url": header.get("index_url") if level else None,
        "listing_source": header.get("listing_source"),
        "listing_note": header.get("listing_note") or None,
        "left_out": [{"version": str(v), "why": str(w)} for v, w in header.get("left_out") or []],
        "next_step": next_step,
    }

"""The demo history's release branches, as vLLM's sit (its RELEASE.md; /work/shared/vllm-facts.md,
"How releases sit in the history"): each release is tagged on a branch of its own,
``releases/vX.Y.Z``, cut from main a few commits before it, with an RC tag, a cherry-pick of a
main commit that landed after the cut and the release's version bump.
"""

from __future__ import annotations

from collections.abc import Callable

from bisect_tool.demo.fastimport import Builder, append

RELEASE_BRANCH = "releases/{tag}"
#: the release branches' commits: an RC bump, a cherry-pick, the release's bump
RELEASE_COMMITS = 3


def cut_release(
    b: Builder,
    marks: dict[str, int],
    tag: str,
    cut: int,
    pick: int,
    bump: Callable[[dict[str, str]], None],
    trailer: str,
) -> None:
    """v0.X.0's branch from ``cut``: an RC bump (tagged), the pick, the release bump (tagged);
    records the pick as ``marks[f"{tag}-pick"]`` and the release as ``marks[tag]``."""
    ref = f"refs/heads/{RELEASE_BRANCH.format(tag=tag)}"
    branch = dict(b.trees[cut])
    when = b.times[cut] + 3_600
    append(branch, "docs/usage.md", f"\nRelease {tag[1:]}rc1.\n")
    rc = b.commit(ref, f"[Release] Bump version to {tag[1:]}rc1", branch, cut, at=when)
    b.tag(f"{tag}rc1", rc, f"vLLM-shaped demo release {tag[1:]}rc1\n")
    # the pick replays what the main commit changed (it applies cleanly: nothing on the
    # branch touched those files since the cut, which is its parent)
    changed = {k: v for k, v in b.trees[pick].items() if b.trees[cut].get(k) != v}
    branch.update(changed)
    picked = b.commit(ref, b.subjects[pick], branch, rc, at=b.times[pick] + 1_800,
                      trailer=trailer)
    marks[f"{tag}-pick"] = picked
    bump(branch)
    append(branch, "docs/usage.md", f"\nRelease {tag[1:]}.\n")
    final = b.commit(ref, f"[Release] Bump version to {tag[1:]}", branch, picked,
                     at=b.times[pick] + 7_200)
    b.tag(tag, final, f"vLLM-shaped demo release {tag[1:]}\n")
    marks[tag] = final


def keep_version(branch: dict[str, str]) -> None:
    """A release whose version the stack already carries (0.26.0): no bump."""


def bump_to_027(branch: dict[str, str]) -> None:
    branch["demollm/__init__.py"] = branch["demollm/__init__.py"].replace(
        '__version__ = "0.26.0"', '__version__ = "0.27.0"')

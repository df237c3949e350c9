"""main's ordinary commits in the demo history, the ones between the planted ones: Python and
docs changes, kernel comments and revision bumps (many candidates with different ``.so`` files
that change nothing numerically), build notes and merged feature branches.
"""

from __future__ import annotations

import random

from bisect_tool.demo.fastimport import Builder, append

#: the kernel source the planted fix edits; ordinary commits comment it and bump its revision
KERNEL = "csrc/layernorm_kernels.c"
_NOTES_ANCHOR = '#include "batch_invariant.h"\n'
_REV_PREFIX = "#define DEMOLLM_KERNELS_REV "

AUTHORS = (
    ("Ada Park", "ada.park@example.com"),
    ("Bo Lindqvist", "bo@example.org"),
    ("Chen Wei", "chen.wei@example.net"),
    ("Dara Okafor", "dokafor@example.com"),
    ("Eli Sato", "eli.sato@example.org"),
    ("Farah Haddad", "farah@example.net"),
)
TOPICS = (
    "scheduler",
    "sampler",
    "logprobs",
    "OpenAI server",
    "metrics",
    "prefix caching",
    "chunked prefill",
    "detokenizer",
    "engine core",
    "KV cache manager",
    "health check",
    "request validation",
    "token ids",
    "model loader",
    "CLI args",
)
_VERBS = ("Fix", "Refactor", "Simplify", "Clean up", "Improve", "Add tests for", "Speed up")
PY_FILES = (
    "demollm/envs.py",
    "demollm/sampling_params.py",
    "demollm/logger.py",
    "demollm/entrypoints/openai/protocol.py",
)
DOC_FILES = (
    "docs/usage.md",
    "docs/features/batch_invariance.md",
    "docs/serving/metrics.md",
    "docs/contributing.md",
)


def bump_rev(tree: dict[str, str]) -> None:
    source = tree[KERNEL]
    start = source.index(_REV_PREFIX) + len(_REV_PREFIX)
    end = source.index("\n", start)
    tree[KERNEL] = source[:start] + str(int(source[start:end]) + 1) + source[end:]


def kernel_note(tree: dict[str, str], pr: int, rng: random.Random) -> None:
    note = rng.choice(
        (
            "keep the launcher's heuristics in one place",
            "lanes beyond hidden_size contribute zeros",
            "document the reduction order",
            "the staging buffer is a plain copy",
            "epsilon is added before the square root",
        )
    )
    tree[KERNEL] = tree[KERNEL].replace(
        _NOTES_ANCHOR, f"{_NOTES_ANCHOR}// Note (#{pr}): {note}.\n", 1
    )


def python_change(tree: dict[str, str], pr: int, rng: random.Random) -> str:
    path = rng.choice(PY_FILES)
    append(tree, path, f"\n\ndef _pr_{pr}_enabled() -> bool:\n    return {rng.random() < 0.5}\n")
    return path


def docs_change(tree: dict[str, str], pr: int, rng: random.Random, topic: str) -> None:
    append(tree, rng.choice(DOC_FILES), f"\n- {topic}: see #{pr}.\n")


def ordinary_commit(
    b: Builder, tree: dict[str, str], head: int, pr: int, topic: str, early: bool, limit: int
) -> int:
    rng = b.rng
    roll = rng.random()
    room = limit - b.objects - 2  # keep the last commit for the release
    if not early and roll < 0.10 and room >= 3:
        # A merged branch: 1-3 commits on a feature branch, then a merge commit on main.
        branch_tree = dict(tree)
        tip = head
        feature = f"demollm/contrib/feature_{pr}.py"
        for step in range(rng.randint(1, min(3, room - 1))):
            append(branch_tree, feature, f"# step {step} of #{pr}\nSTEP_{step} = {step}\n")
            if step == 0 and rng.random() < 0.3:
                kernel_note(branch_tree, pr, rng)
            tip = b.commit("refs/heads/_branch", f"wip: {topic} ({step + 1})", branch_tree, tip)
        tree.clear()
        tree.update(branch_tree)
        user = rng.choice(AUTHORS)[0].split()[0].lower()
        return b.commit(
            "refs/heads/main",
            f"Merge pull request #{pr} from {user}/{topic.replace(' ', '-').lower()}",
            tree,
            head,
            merge=tip,
        )
    if roll < 0.40 or early:
        python_change(tree, pr, rng)
        tag = rng.choice(("[Core]", "[Frontend]", "[Misc]", "[Bugfix]", "[V1]"))
        return b.commit(
            "refs/heads/main", f"{tag} {rng.choice(_VERBS)} {topic} (#{pr})", tree, head
        )
    if roll < 0.58:
        docs_change(tree, pr, rng, topic)
        return b.commit("refs/heads/main", f"[Doc] Document {topic} (#{pr})", tree, head)
    if roll < 0.72:
        kernel_note(tree, pr, rng)
        return b.commit(
            "refs/heads/main", f"[Kernel] Comment RMSNorm {topic} path (#{pr})", tree, head
        )
    if roll < 0.92:
        bump_rev(tree)
        if rng.random() < 0.5:
            python_change(tree, pr, rng)
        verb = rng.choice(("Refactor", "Tidy", "Reorganise", "Simplify"))
        return b.commit(
            "refs/heads/main", f"[Kernel] {verb} layernorm launcher (#{pr})", tree, head
        )
    append(tree, "CMakeLists.txt", f"# Build note (#{pr}): {topic}.\n")
    return b.commit("refs/heads/main", f"[CI/Build] Update build for {topic} (#{pr})", tree, head)

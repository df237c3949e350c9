"""A generated git history for the demo: a few hundred commits shaped like vLLM's.

``csrc/`` holds the RMSNorm kernel at every commit; ``setup.py`` builds it into
``demollm/_kernels.so`` (the demo's swap set). Its releases sit as vLLM's do (its RELEASE.md;
/work/shared/vllm-facts.md, "How releases sit in the history"): ``main`` carries squash-merged
PRs and merged branches (first-parent history), and each release is tagged on a branch of its
own, ``releases/v0.26.0`` and ``releases/v0.27.0``, cut from main a few commits before it, with
an RC tag (``v0.26.0rc1``), a version bump and a cherry-pick of a main commit that landed after
the cut (``git cherry-pick -x`` on 0.26, a plain pick on 0.27, as happens). So the tags are not
on one line of history: a bisect between them starts at their merge base, as git's does.
``v0.26.0`` is the pinned stack's own sources (old end); ``v0.27.0`` the new end. Between their
branch points, main has Python-only and docs-only commits, kernel commits that change nothing
numerically (comments, revision bumps: many candidates with different ``.so`` files), commits
that do not build (a syntax error fixed a few commits later; a source listed before it exists),
the switch of the wheels' default CUDA from 12.9 to 13.0 in ``.buildkite/release-pipeline.yaml``
(vLLM PR #39878, 2026-04-15: the demo's dates put it on that day), and exactly one commit that
pins the RMSNorm block size under ``VLLM_BATCH_INVARIANT`` (vLLM PR #48391). The same seed always
gives the same commits, byte for byte (fixed dates and authors), so SHAs are stable. Written with
``git fast-import``: main in one process, then the release branches (whose ``-x`` trailers name
main's SHAs) in a second.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bisect_tool.demo.pinned import BUILD_COMMAND, STACK_DIR, SWAP_PATH
from bisect_tool.errors import InfrastructureError, UsageError

GOOD_TAG = "v0.27.0"  # new end: has the fix
BAD_TAG = "v0.26.0"  # old end: the pinned stack's sources
PLANTED_PR = 48391
PLANTED_SUBJECT = (
    "[Bugfix][Kernel] Fix batch invariance in RMSNorm kernels by pinning block size (#48391)"
)
KERNEL = "csrc/layernorm_kernels.c"

_BLOCK_LINE = "  int max_block_size = (num_tokens < 256) ? 1024 : 256;\n"
_FIXED_BLOCK = (
    "  // Batch-invariant mode pins the block size: a row's reduction order must not depend on\n"
    "  // how many tokens share the launch (#48391).\n"
    "  int max_block_size = vllm_is_batch_invariant() ? 1024 : ((num_tokens < 256) ? 1024 : 256);\n"
)
_NOTES_ANCHOR = '#include "batch_invariant.h"\n'

# The planted Python-side regression, a text edit of the stack's model.py (anchors asserted).
MODEL = "demollm/model.py"
LM_HEAD_SPLIT_ROWS = 32
PYTHON_SUBJECT = "[Perf] Split the LM head's reduction for large decode batches (#{pr})"
_SPLIT_K_ANCHOR = "SPLIT_K_BELOW = 64\n"
_SPLIT_ROWS_BLOCK = """
# Decode batches of at least this many requests reduce the LM head in two halves of the hidden
# dimension: each half of the weight stays in cache across the batch's rows (#{pr}).
LM_HEAD_SPLIT_ROWS = {rows}
"""
_LOGITS_ANCHOR = """\
        out = []
        for end in bounds[1:]:
            logits = np.dot(h[end - 1], self.lm_head)
"""
_SPLIT_LOGITS = """\
        out = []
        split = len(segments) >= LM_HEAD_SPLIT_ROWS  # large decode batches (#{pr})
        k = self.config.hidden_size // 2
        for end in bounds[1:]:
            if split:
                logits = np.dot(h[end - 1, :k], self.lm_head[:k]) + np.dot(
                    h[end - 1, k:], self.lm_head[k:]
                )
            else:
                logits = np.dot(h[end - 1], self.lm_head)
"""
_SYNTAX_OK = "  return total;\n}\n"
_SYNTAX_BROKEN = "  return total\n}\n"
_REV_PREFIX = "#define DEMOLLM_KERNELS_REV "
_SRC_LIST = '  "csrc/layernorm_kernels.c"\n'
_ACTIVATION = "csrc/activation_kernels.c"
_ACTIVATION_SRC = """\
// SiLU-and-mul, row by row (vLLM's csrc/activation_kernels.cu, without the GPU).
#include <math.h>
#include <stdint.h>

int silu_and_mul(float *out, const float *input, int64_t num_tokens, int64_t d) {
  for (int64_t r = 0; r < num_tokens; ++r) {
    const float *x = input + r * 2 * d;
    for (int64_t i = 0; i < d; ++i) out[r * d + i] = x[i] / (1.0f + expf(-x[i])) * x[d + i];
  }
  return 0;
}
"""

_AUTHORS = (
    ("Ada Park", "ada.park@example.com"),
    ("Bo Lindqvist", "bo@example.org"),
    ("Chen Wei", "chen.wei@example.net"),
    ("Dara Okafor", "dokafor@example.com"),
    ("Eli Sato", "eli.sato@example.org"),
    ("Farah Haddad", "farah@example.net"),
)
_TOPICS = (
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
_PY_FILES = (
    "demollm/envs.py",
    "demollm/sampling_params.py",
    "demollm/logger.py",
    "demollm/entrypoints/openai/protocol.py",
)
_DOC_FILES = (
    "docs/usage.md",
    "docs/features/batch_invariance.md",
    "docs/serving/metrics.md",
    "docs/contributing.md",
)
_STACK_FILES = ("CMakeLists.txt", "setup.py", "csrc/batch_invariant.h", KERNEL)

# The wheels' build pipeline (vLLM's .buildkite/release-pipeline.yaml): which CUDA the default
# wheel folder is built for. PR #39878 switched it from 12.9 to 13.0 on 2026-04-15.
PIPELINE = ".buildkite/release-pipeline.yaml"
_PIPELINE_TEXT = """\
# Builds a wheel for every commit merged into main (the per-commit wheel index).
steps:
  - label: "Build wheel - default"
    env:
      DEFAULT_CUDA_VERSION: "{cuda}"
  - label: "Build wheel - variant"
    env:
      VARIANT_CUDA_VERSION: "{other}"
"""
CUDA_SWITCH_TIME = 1_776_211_200  # 2026-04-15T00:00:00Z: vLLM PR #39878 merged
CUDA_SWITCH_SUBJECT = "[Build] Switch default CUDA to 13.0 for the wheels (#{pr})"
MAINLINE = "main"
RELEASE_BRANCH = "releases/{tag}"
#: the release branches' commits: an RC bump, a cherry-pick, the release's bump
RELEASE_COMMITS = 3


def pipeline_text(cuda: str) -> str:
    """The build pipeline file whose default wheel is built for CUDA ``cuda`` ("12.9")."""
    other = "12.9" if cuda == "13.0" else "13.0"
    return _PIPELINE_TEXT.format(cuda=cuda, other=other)


def default_cuda(pipeline: str) -> str:
    """The CUDA version the default wheel folder holds, read from a commit's pipeline file."""
    for line in pipeline.splitlines():
        if "DEFAULT_CUDA_VERSION" in line:
            return line.split(":", 1)[1].strip().strip('"')
    return ""


@dataclass(frozen=True)
class DemoHistory:
    repo: Path
    planted_commit: str  # full SHA of the fix (the flip commit when bisecting good=v0.27.0)
    # full SHA of the Python-side regression (the flip commit when bisecting good=v0.26.0 with
    # recipes/demo-python.toml); it touches only demollm/model.py
    python_commit: str
    good_tag: str
    bad_tag: str
    build_command: str  # run in a worktree's root; writes the swap set
    swap_set: tuple[str, ...]
    planted_pr: int = PLANTED_PR
    broken_commits: tuple[str, ...] = ()  # first-parent commits whose build fails
    #: v0.27.0's first-parent chain, oldest first: main up to where its release branch left
    #: main, then that branch (the line a bisect between the tags walks)
    first_parent: tuple[str, ...] = ()
    #: where v0.26.0's release branch left main: the bisect's old end stands there (git tests
    #: the merge base of the two tags first)
    merge_base: str = ""
    main_commits: tuple[str, ...] = ()  # main's own first-parent chain, oldest first
    #: each release branch's commits, oldest first (not on main: no per-commit wheel)
    release_commits: dict[str, tuple[str, ...]] = field(default_factory=dict)
    picks: dict[str, str] = field(default_factory=dict)  # cherry-pick -> the main commit it copies
    cuda_switch: str = ""  # the main commit that switched the default wheels to CUDA 13.0


def _initial_tree() -> dict[str, str]:
    tree: dict[str, str] = {}
    for name in _STACK_FILES:
        tree[name] = (STACK_DIR / name).read_text()
    for path in sorted((STACK_DIR / "demollm").glob("*.py")):
        tree[f"demollm/{path.name}"] = path.read_text()
    tree[".gitignore"] = "*.so\n*.so.tmp\n__pycache__/\n"
    tree[PIPELINE] = pipeline_text("12.9")
    tree["README.md"] = (
        "# demollm\n\nA tiny engine shaped like vLLM: the built-in target of `bisect demo`.\n\n"
        f"Build the compiled extension with `{BUILD_COMMAND}`.\n"
    )
    for name in _PY_FILES:
        tree[name] = f'"""{name}: settings and helpers of demollm."""\n'
    tree["demollm/entrypoints/__init__.py"] = ""
    tree["demollm/entrypoints/openai/__init__.py"] = ""
    for name in _DOC_FILES:
        title = Path(name).stem.replace("_", " ").title()
        tree[name] = f"# {title}\n"
    return tree


class _Builder:
    """Collects commits as fast-import commands; every commit writes what changed."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.out: list[bytes] = []
        self.mark = 0
        self.time = CUDA_SWITCH_TIME
        self.times: dict[int, int] = {}
        self.pr = 46_100
        self.trees: dict[int, dict[str, str]] = {}
        self.subjects: dict[int, str] = {}
        self.objects = 0

    def next_pr(self) -> int:
        self.pr += self.rng.randint(3, 14)
        if self.pr == PLANTED_PR:
            self.pr += 1
        return self.pr

    def commit(
        self,
        ref: str,
        subject: str,
        tree: dict[str, str],
        parent: int | None,
        merge: int | None = None,
        *,
        at: int | None = None,
        trailer: str = "",
    ) -> int:
        """One commit on ``ref``; ``at`` dates it (default: after the last one), ``trailer``
        ends its message (a cherry-pick's ``(cherry picked from commit X)``)."""
        self.mark += 1
        self.objects += 1
        if at is None:
            self.time += self.rng.randint(1_200, 30_000)
        when = self.time if at is None else at
        self.times[self.mark] = when
        name, email = self.rng.choice(_AUTHORS)
        base = self.trees.get(parent, {}) if parent is not None else {}
        lines = [f"commit {ref}\nmark :{self.mark}\n".encode()]
        who = f"{name} <{email}> {when} +0000\n"
        lines.append(f"author {who}committer {who}".encode())
        body = f"\n\n{trailer}" if trailer else ""
        message = f"{subject}{body}\n\nSigned-off-by: {name} <{email}>\n".encode()
        lines.append(b"data %d\n%s\n" % (len(message), message))
        if parent is not None:
            lines.append(f"from :{parent}\n".encode())
        if merge is not None:
            lines.append(f"merge :{merge}\n".encode())
        for path in sorted(set(base) - set(tree)):
            lines.append(f"D {path}\n".encode())
        for path in sorted(tree):
            if base.get(path) != tree[path]:
                data = tree[path].encode()
                lines.append(
                    b"M 100644 inline %s\ndata %d\n%s\n" % (path.encode(), len(data), data)
                )
        self.out.append(b"".join(lines) + b"\n")
        self.trees[self.mark] = dict(tree)
        self.subjects[self.mark] = subject
        return self.mark

    def tag(self, name: str, mark: int, message: str) -> None:
        who = f"Release Bot <release@example.com> {self.times.get(mark, self.time)} +0000\n"
        data = message.encode()
        self.out.append(
            f"tag {name}\nfrom :{mark}\ntagger {who}".encode()
            + b"data %d\n%s\n" % (len(data), data)
        )


def _append(tree: dict[str, str], path: str, text: str) -> None:
    tree[path] = tree.get(path, "") + text


def _bump_rev(tree: dict[str, str]) -> None:
    source = tree[KERNEL]
    start = source.index(_REV_PREFIX) + len(_REV_PREFIX)
    end = source.index("\n", start)
    tree[KERNEL] = source[:start] + str(int(source[start:end]) + 1) + source[end:]


def _kernel_note(tree: dict[str, str], pr: int, rng: random.Random) -> None:
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


def split_lm_head(model_text: str, pr: int) -> str:
    """``model.py`` with the planted Python-side regression (PR ``pr``): from
    ``LM_HEAD_SPLIT_ROWS`` segments in a step on, each segment's logits are the sum of two
    half-width products, rounded differently from the one full product below that size."""
    for anchor in (_SPLIT_K_ANCHOR, _LOGITS_ANCHOR):
        assert model_text.count(anchor) == 1, f"model.py lost its anchor {anchor.strip()!r}"
    text = model_text.replace(
        _SPLIT_K_ANCHOR,
        _SPLIT_K_ANCHOR + _SPLIT_ROWS_BLOCK.format(pr=pr, rows=LM_HEAD_SPLIT_ROWS),
    )
    return text.replace(_LOGITS_ANCHOR, _SPLIT_LOGITS.format(pr=pr))


def _python_change(tree: dict[str, str], pr: int, rng: random.Random) -> str:
    path = rng.choice(_PY_FILES)
    _append(tree, path, f"\n\ndef _pr_{pr}_enabled() -> bool:\n    return {rng.random() < 0.5}\n")
    return path


def _docs_change(tree: dict[str, str], pr: int, rng: random.Random, topic: str) -> None:
    _append(tree, rng.choice(_DOC_FILES), f"\n- {topic}: see #{pr}.\n")


def generate(path: Path, *, seed: int = 0, commits: int = 300) -> DemoHistory:
    """Write the demo repository at ``path`` (must not exist or be empty); ``commits`` counts
    every commit object, branch commits included."""
    if commits < 60:
        raise UsageError(f"the demo history needs at least 60 commits, got {commits}")
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise UsageError(f"{path} is not empty: give a new directory for the demo repository")
    rng = random.Random(f"bisect-demo-history:{seed}")
    b = _Builder(rng)
    # main's own commits: the rest are merged branches' commits and the release branches'
    main_len = int((commits - 2 * RELEASE_COMMITS) * 0.86)
    cut_26 = 4  # v0.26.0's branch leaves main here; the next main commit is picked onto it
    after_27 = 3  # main commits after v0.27.0's branch leaves it; the first is picked onto it
    planted_at = rng.randint(int(main_len * 0.35), int(main_len * 0.65))
    # The breakages keep clear of the planted commit, so its neighbours all build.
    lo, hi = cut_26 + 3, main_len - after_27 - 4
    choices = ([i for i in range(lo, hi) if abs(i - planted_at) > 12]
               or [i for i in range(lo, hi) if abs(i - planted_at) > 6])
    syntax_at = rng.choice(choices)
    syntax_len = rng.randint(2, 4)
    # well clear of the syntax error where the history has room (a short one keeps 3 apart)
    missing_at = rng.choice([i for i in choices if abs(i - syntax_at) > syntax_len + 6]
                            or [i for i in choices if abs(i - syntax_at) > syntax_len + 3]
                            or [i for i in choices if abs(i - syntax_at) > syntax_len + 1])
    # The Python-side regression keeps clear of the kernel fix and of every commit that does
    # not build (and of their neighbours), so a bisect for it never ends on an untestable block.
    taken = {planted_at, missing_at, missing_at + 1, *range(syntax_at, syntax_at + syntax_len + 1)}
    python_at = rng.choice([i for i in range(lo, hi) if all(abs(i - t) > 3 for t in taken)])
    taken |= {python_at}
    switch_at = rng.choice([i for i in range(int(main_len * 0.2), int(main_len * 0.8))
                            if all(abs(i - t) > 2 for t in taken)])
    taken |= {switch_at}
    # dated so that the switch falls on the day vLLM's did: a commit object comes about 4.3
    # hours after the last, and main holds about 86 % of them; start early enough that the
    # commits before the switch never pass that day
    b.time = CUDA_SWITCH_TIME - int(switch_at * 15_600 / 0.86 * 1.3)

    # PR numbers rise about 8.5 per commit, centred so that the fix's own number falls in place.
    b.pr = PLANTED_PR - int(planted_at * 8.5) - 20
    tree = _initial_tree()
    head = b.commit("refs/heads/main", "Initial import of demollm", tree, None)
    main_marks = [head]
    broken_marks: list[int] = []
    planted_mark = python_mark = switch_mark = 0
    marks: dict[str, int] = {}
    index = 1
    syntax_open = False
    # main up to where v0.27.0's branch leaves it; then ``after_27`` more main commits and the
    # release branches' commits
    reserved = 2 * RELEASE_COMMITS
    while b.objects < commits - reserved - after_27:
        pr = b.next_pr()
        topic = rng.choice(_TOPICS)
        room = commits - reserved - after_27 - b.objects
        if index == switch_at:
            tree[PIPELINE] = pipeline_text("13.0")
            b.time = max(b.time + 1_200, CUDA_SWITCH_TIME)
            head = switch_mark = b.commit(
                "refs/heads/main", CUDA_SWITCH_SUBJECT.format(pr=pr), tree, head, at=b.time)
        elif index == planted_at:
            assert _BLOCK_LINE in tree[KERNEL]
            tree[KERNEL] = tree[KERNEL].replace(_BLOCK_LINE, _FIXED_BLOCK)
            _bump_rev(tree)
            _append(tree, "docs/features/batch_invariance.md", "\nRMSNorm pins its block size.\n")
            head = planted_mark = b.commit("refs/heads/main", PLANTED_SUBJECT, tree, head)
        elif index == python_at:
            tree[MODEL] = split_lm_head(tree[MODEL], pr)
            head = python_mark = b.commit(
                "refs/heads/main", PYTHON_SUBJECT.format(pr=pr), tree, head
            )
        elif index == syntax_at:
            tree[KERNEL] = tree[KERNEL].replace(_SYNTAX_OK, _SYNTAX_BROKEN, 1)
            _bump_rev(tree)
            syntax_open = True
            head = b.commit(
                "refs/heads/main",
                f"[Kernel] Restructure the RMSNorm block reduction (#{pr})",
                tree,
                head,
            )
        elif index == syntax_at + syntax_len:
            tree[KERNEL] = tree[KERNEL].replace(_SYNTAX_BROKEN, _SYNTAX_OK, 1)
            syntax_open = False
            head = b.commit(
                "refs/heads/main",
                f"[Bugfix][CI/Build] Fix the build of layernorm kernels (#{pr})",
                tree,
                head,
            )
        elif index == missing_at:
            tree["CMakeLists.txt"] = tree["CMakeLists.txt"].replace(
                _SRC_LIST, _SRC_LIST + f'  "{_ACTIVATION}"\n'
            )
            head = b.commit(
                "refs/heads/main",
                f"[CI/Build] List activation kernels in the build (#{pr})",
                tree,
                head,
            )
        elif index == missing_at + 1:
            tree[_ACTIVATION] = _ACTIVATION_SRC
            head = b.commit(
                "refs/heads/main", f"[Kernel] Add SiLU-and-mul kernel (#{pr})", tree, head
            )
        elif index == cut_26 + 1:
            # a fix landing on main after v0.26.0's cut: picked onto its branch (with -x)
            _python_change(tree, pr, rng)
            head = marks["pick26"] = b.commit(
                "refs/heads/main", f"[Bugfix] Fix {topic} (#{pr})", tree, head)
        else:
            # no merged branch (up to 4 commits) where it could leave too few commits for the
            # planted ones still to come
            single = index <= cut_26 or room - 4 <= max(taken) - index + 2
            head = _ordinary(b, tree, head, pr, topic, single, commits - reserved - after_27)
        if index == missing_at or syntax_open:
            broken_marks.append(head)
        if index == cut_26:
            marks["cut26"] = head
        main_marks.append(head)
        index += 1
    assert planted_mark, "the planted commit must be in the history"
    assert python_mark, "the Python-side regression must be in the history"
    assert switch_mark, "the CUDA switch must be in the history"
    assert not syntax_open and index > missing_at + 1, "every breakage is fixed before the cut"
    marks["cut27"] = head
    for n in range(after_27):
        pr = b.next_pr()
        topic = rng.choice(_TOPICS)
        if n == 0:
            # a kernel change landing on main after v0.27.0's cut: picked onto its branch
            # (without -x: only its patch id says what it copies)
            _kernel_note(tree, pr, rng)
            head = marks["pick27"] = b.commit(
                "refs/heads/main", f"[Kernel] Comment RMSNorm {topic} path (#{pr})", tree, head)
        else:
            head = _ordinary(b, tree, head, pr, topic, True, commits - reserved)
        main_marks.append(head)
    main_tree = dict(tree)

    def release(tag: str, cut: int, pick: int, bump: Callable[[dict[str, str]], None],
                trailer: str) -> None:
        """v0.X.0's branch from ``cut``: an RC bump (tagged), the pick, the release bump."""
        ref = f"refs/heads/{RELEASE_BRANCH.format(tag=tag)}"
        branch = dict(b.trees[cut])
        when = b.times[cut] + 3_600
        _append(branch, "docs/usage.md", f"\nRelease {tag[1:]}rc1.\n")
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
        _append(branch, "docs/usage.md", f"\nRelease {tag[1:]}.\n")
        final = b.commit(ref, f"[Release] Bump version to {tag[1:]}", branch, picked,
                         at=b.times[pick] + 7_200)
        b.tag(tag, final, f"vLLM-shaped demo release {tag[1:]}\n")
        marks[tag] = final

    def to_027(branch: dict[str, str]) -> None:
        branch["demollm/__init__.py"] = branch["demollm/__init__.py"].replace(
            '__version__ = "0.26.0"', '__version__ = "0.27.0"')

    def branches(sha_of: Callable[[int], str]) -> None:
        # written once main is (its SHAs are in the -x trailer)
        release(BAD_TAG, marks["cut26"], marks["pick26"], lambda branch: None,
                trailer=f"(cherry picked from commit {sha_of(marks['pick26'])})")
        release(GOOD_TAG, marks["cut27"], marks["pick27"], to_027, trailer="")
        assert b.objects == commits and tree == main_tree

    return _write(path, b, planted_mark, python_mark, switch_mark, broken_marks, main_marks,
                  marks, branches)


def _ordinary(
    b: _Builder, tree: dict[str, str], head: int, pr: int, topic: str, early: bool, limit: int
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
            _append(branch_tree, feature, f"# step {step} of #{pr}\nSTEP_{step} = {step}\n")
            if step == 0 and rng.random() < 0.3:
                _kernel_note(branch_tree, pr, rng)
            tip = b.commit("refs/heads/_branch", f"wip: {topic} ({step + 1})", branch_tree, tip)
        tree.clear()
        tree.update(branch_tree)
        user = rng.choice(_AUTHORS)[0].split()[0].lower()
        return b.commit(
            "refs/heads/main",
            f"Merge pull request #{pr} from {user}/{topic.replace(' ', '-').lower()}",
            tree,
            head,
            merge=tip,
        )
    if roll < 0.40 or early:
        _python_change(tree, pr, rng)
        tag = rng.choice(("[Core]", "[Frontend]", "[Misc]", "[Bugfix]", "[V1]"))
        return b.commit(
            "refs/heads/main", f"{tag} {rng.choice(_VERBS)} {topic} (#{pr})", tree, head
        )
    if roll < 0.58:
        _docs_change(tree, pr, rng, topic)
        return b.commit("refs/heads/main", f"[Doc] Document {topic} (#{pr})", tree, head)
    if roll < 0.72:
        _kernel_note(tree, pr, rng)
        return b.commit(
            "refs/heads/main", f"[Kernel] Comment RMSNorm {topic} path (#{pr})", tree, head
        )
    if roll < 0.92:
        _bump_rev(tree)
        if rng.random() < 0.5:
            _python_change(tree, pr, rng)
        verb = rng.choice(("Refactor", "Tidy", "Reorganise", "Simplify"))
        return b.commit(
            "refs/heads/main", f"[Kernel] {verb} layernorm launcher (#{pr})", tree, head
        )
    _append(tree, "CMakeLists.txt", f"# Build note (#{pr}): {topic}.\n")
    return b.commit("refs/heads/main", f"[CI/Build] Update build for {topic} (#{pr})", tree, head)


def _git(repo: Path, *args: str, data: bytes | None = None) -> str:
    try:
        result = subprocess.run(
            ["git", "-C", str(repo), *args], input=data, capture_output=True, check=False
        )
    except FileNotFoundError:
        raise InfrastructureError(
            "git is not installed: install it (apt-get install git)"
        ) from None
    if result.returncode != 0:
        raise InfrastructureError(f"git {args[0]} failed: {result.stderr.decode().strip()}")
    return result.stdout.decode()


def _write(
    path: Path,
    b: _Builder,
    planted: int,
    python: int,
    switch: int,
    broken: list[int],
    main_marks: list[int],
    marks: dict[str, int],
    branches: Callable[[Callable[[int], str]], None],
) -> DemoHistory:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", MAINLINE)
    marks_file = path / ".git" / "demo-marks"
    _git(path, "fast-import", "--quiet", f"--export-marks={marks_file}", data=b"".join(b.out))
    sha = dict(line.split()[0:2] for line in marks_file.read_text().splitlines())

    def full(mark: int) -> str:
        return sha[f":{mark}"]

    b.out = []
    branches(full)
    _git(path, "fast-import", "--quiet", f"--import-marks={marks_file}",
         f"--export-marks={marks_file}", data=b"".join(b.out))
    sha = dict(line.split()[0:2] for line in marks_file.read_text().splitlines())
    marks_file.unlink()
    _git(path, "update-ref", "-d", "refs/heads/_branch")
    _git(path, "checkout", "-q", "-f", MAINLINE)
    line = _git(path, "rev-list", "--first-parent", "--reverse", GOOD_TAG).split()
    releases = {
        tag: tuple(_git(path, "rev-list", "--reverse", tag, "--not", MAINLINE).split())
        for tag in (BAD_TAG, GOOD_TAG)
    }
    return DemoHistory(
        repo=path,
        planted_commit=full(planted),
        python_commit=full(python),
        good_tag=GOOD_TAG,
        bad_tag=BAD_TAG,
        build_command=BUILD_COMMAND,
        swap_set=(SWAP_PATH,),
        broken_commits=tuple(full(m) for m in broken),
        first_parent=tuple(line),
        merge_base=full(marks["cut26"]),
        main_commits=tuple(full(m) for m in main_marks),
        release_commits=releases,
        picks={full(marks[f"{BAD_TAG}-pick"]): full(marks["pick26"]),
               full(marks[f"{GOOD_TAG}-pick"]): full(marks["pick27"])},
        cuda_switch=full(switch),
    )

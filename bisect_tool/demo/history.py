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
``git fast-import`` (demo/fastimport.py): main in one process, then the release branches
(demo/releases.py; their ``-x`` trailers name main's SHAs) in a second. main's everyday commits
between the planted ones come from demo/ordinary.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bisect_tool.demo.fastimport import Builder, append, git
from bisect_tool.demo.ordinary import (
    AUTHORS,
    DOC_FILES,
    KERNEL,
    PY_FILES,
    TOPICS,
    bump_rev,
    kernel_note,
    ordinary_commit,
    python_change,
)
from bisect_tool.demo.pinned import BUILD_COMMAND, STACK_DIR, SWAP_PATH
from bisect_tool.demo.releases import RELEASE_COMMITS, bump_to_027, cut_release, keep_version
from bisect_tool.errors import UsageError

GOOD_TAG = "v0.27.0"  # new end: has the fix
BAD_TAG = "v0.26.0"  # old end: the pinned stack's sources
PLANTED_PR = 48391
PLANTED_SUBJECT = (
    "[Bugfix][Kernel] Fix batch invariance in RMSNorm kernels by pinning block size (#48391)"
)

_BLOCK_LINE = "  int max_block_size = (num_tokens < 256) ? 1024 : 256;\n"
_FIXED_BLOCK = (
    "  // Batch-invariant mode pins the block size: a row's reduction order must not depend on\n"
    "  // how many tokens share the launch (#48391).\n"
    "  int max_block_size = vllm_is_batch_invariant() ? 1024 : ((num_tokens < 256) ? 1024 : 256);\n"
)

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
    for name in PY_FILES:
        tree[name] = f'"""{name}: settings and helpers of demollm."""\n'
    tree["demollm/entrypoints/__init__.py"] = ""
    tree["demollm/entrypoints/openai/__init__.py"] = ""
    for name in DOC_FILES:
        title = Path(name).stem.replace("_", " ").title()
        tree[name] = f"# {title}\n"
    return tree


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


@dataclass(frozen=True)
class _Plan:
    """Where main's planted commits fall: indexes into main's first-parent chain (the initial
    import is 0)."""

    commits: int  # every commit object, branch commits included
    planted_at: int
    syntax_at: int  # the build breaks here ...
    syntax_len: int  # ... and is fixed this many commits later
    missing_at: int  # a source listed before it exists (added by the next commit)
    python_at: int
    switch_at: int
    taken: frozenset[int]  # the planted positions and their neighbours kept clear
    cut_26: int = 4  # v0.26.0's branch leaves main here; the next main commit is picked onto it
    after_27: int = 3  # main commits after v0.27.0's branch leaves it; the first is picked onto it

    @property
    def main_limit(self) -> int:
        """The commit objects written by the time v0.27.0's branch leaves main."""
        return self.commits - 2 * RELEASE_COMMITS - self.after_27

    def broken(self, index: int) -> bool:
        """Whether main's commit ``index`` does not build."""
        return index == self.missing_at or (
            self.syntax_at <= index < self.syntax_at + self.syntax_len
        )


def _plan(rng: random.Random, commits: int) -> _Plan:
    # main's own commits: the rest are merged branches' commits and the release branches'
    main_len = int((commits - 2 * RELEASE_COMMITS) * 0.86)
    cut_26, after_27 = _Plan.cut_26, _Plan.after_27
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
    return _Plan(commits, planted_at, syntax_at, syntax_len, missing_at, python_at, switch_at,
                 frozenset(taken))


def generate(path: Path, *, seed: int = 0, commits: int = 300) -> DemoHistory:
    """Write the demo repository at ``path`` (must not exist or be empty); ``commits`` counts
    every commit object, branch commits included."""
    if commits < 60:
        raise UsageError(f"the demo history needs at least 60 commits, got {commits}")
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise UsageError(f"{path} is not empty: give a new directory for the demo repository")
    rng = random.Random(f"bisect-demo-history:{seed}")
    b = Builder(rng, AUTHORS, PLANTED_PR)
    plan = _plan(rng, commits)
    # dated so that the switch falls on the day vLLM's did: a commit object comes about 4.3
    # hours after the last, and main holds about 86 % of them; start early enough that the
    # commits before the switch never pass that day
    b.time = CUDA_SWITCH_TIME - int(plan.switch_at * 15_600 / 0.86 * 1.3)

    # PR numbers rise about 8.5 per commit, centred so that the fix's own number falls in place.
    b.pr = PLANTED_PR - int(plan.planted_at * 8.5) - 20
    tree = _initial_tree()
    head = b.commit("refs/heads/main", "Initial import of demollm", tree, None)
    main_marks = [head]
    broken_marks: list[int] = []
    marks: dict[str, int] = {}
    head = _main_to_cut(b, plan, tree, head, main_marks, broken_marks, marks)
    marks["cut27"] = head
    _main_after_cut(b, plan, tree, head, main_marks, marks)
    main_tree = dict(tree)

    def branches(sha_of: Callable[[int], str]) -> None:
        # written once main is (its SHAs are in the -x trailer)
        cut_release(b, marks, BAD_TAG, marks["cut26"], marks["pick26"], keep_version,
                    trailer=f"(cherry picked from commit {sha_of(marks['pick26'])})")
        cut_release(b, marks, GOOD_TAG, marks["cut27"], marks["pick27"], bump_to_027,
                    trailer="")
        assert b.objects == commits and tree == main_tree

    return _write(path, b, marks["planted"], marks["python"], marks["switch"], broken_marks,
                  main_marks, marks, branches)


def _main_to_cut(
    b: Builder,
    plan: _Plan,
    tree: dict[str, str],
    head: int,
    main_marks: list[int],
    broken_marks: list[int],
    marks: dict[str, int],
) -> int:
    """main up to where v0.27.0's branch leaves it (``after_27`` more main commits and the
    release branches' commits come after); returns its last commit's mark."""
    index = 1
    while b.objects < plan.main_limit:
        pr = b.next_pr()
        topic = b.rng.choice(TOPICS)
        room = plan.main_limit - b.objects
        planted = _planted(b, plan, tree, head, index, pr, topic, marks)
        if planted is not None:
            head = planted
        else:
            # no merged branch (up to 4 commits) where it could leave too few commits for the
            # planted ones still to come
            single = index <= plan.cut_26 or room - 4 <= max(plan.taken) - index + 2
            head = ordinary_commit(b, tree, head, pr, topic, single, plan.main_limit)
        if plan.broken(index):
            broken_marks.append(head)
        if index == plan.cut_26:
            marks["cut26"] = head
        main_marks.append(head)
        index += 1
    assert "planted" in marks, "the planted commit must be in the history"
    assert "python" in marks, "the Python-side regression must be in the history"
    assert "switch" in marks, "the CUDA switch must be in the history"
    assert not plan.broken(index - 1) and index > plan.missing_at + 1, (
        "every breakage is fixed before the cut")
    return head


def _planted(
    b: Builder,
    plan: _Plan,
    tree: dict[str, str],
    head: int,
    index: int,
    pr: int,
    topic: str,
    marks: dict[str, int],
) -> int | None:
    """The commit ``plan`` puts at main's ``index``, written (its mark); None where it puts
    none. The fix, the regression and the CUDA switch are recorded in ``marks``."""
    main = "refs/heads/main"
    if index == plan.switch_at:
        tree[PIPELINE] = pipeline_text("13.0")
        b.time = max(b.time + 1_200, CUDA_SWITCH_TIME)
        marks["switch"] = b.commit(main, CUDA_SWITCH_SUBJECT.format(pr=pr), tree, head, at=b.time)
        return marks["switch"]
    if index == plan.planted_at:
        assert _BLOCK_LINE in tree[KERNEL]
        tree[KERNEL] = tree[KERNEL].replace(_BLOCK_LINE, _FIXED_BLOCK)
        bump_rev(tree)
        append(tree, "docs/features/batch_invariance.md", "\nRMSNorm pins its block size.\n")
        marks["planted"] = b.commit(main, PLANTED_SUBJECT, tree, head)
        return marks["planted"]
    if index == plan.python_at:
        tree[MODEL] = split_lm_head(tree[MODEL], pr)
        marks["python"] = b.commit(main, PYTHON_SUBJECT.format(pr=pr), tree, head)
        return marks["python"]
    if index == plan.syntax_at:
        tree[KERNEL] = tree[KERNEL].replace(_SYNTAX_OK, _SYNTAX_BROKEN, 1)
        bump_rev(tree)
        subject = f"[Kernel] Restructure the RMSNorm block reduction (#{pr})"
    elif index == plan.syntax_at + plan.syntax_len:
        tree[KERNEL] = tree[KERNEL].replace(_SYNTAX_BROKEN, _SYNTAX_OK, 1)
        subject = f"[Bugfix][CI/Build] Fix the build of layernorm kernels (#{pr})"
    elif index == plan.missing_at:
        tree["CMakeLists.txt"] = tree["CMakeLists.txt"].replace(
            _SRC_LIST, _SRC_LIST + f'  "{_ACTIVATION}"\n'
        )
        subject = f"[CI/Build] List activation kernels in the build (#{pr})"
    elif index == plan.missing_at + 1:
        tree[_ACTIVATION] = _ACTIVATION_SRC
        subject = f"[Kernel] Add SiLU-and-mul kernel (#{pr})"
    elif index == plan.cut_26 + 1:
        # a fix landing on main after v0.26.0's cut: picked onto its branch (with -x)
        python_change(tree, pr, b.rng)
        marks["pick26"] = b.commit(main, f"[Bugfix] Fix {topic} (#{pr})", tree, head)
        return marks["pick26"]
    else:
        return None
    return b.commit(main, subject, tree, head)


def _main_after_cut(
    b: Builder,
    plan: _Plan,
    tree: dict[str, str],
    head: int,
    main_marks: list[int],
    marks: dict[str, int],
) -> None:
    """main's ``after_27`` commits after v0.27.0's branch leaves it."""
    for n in range(plan.after_27):
        pr = b.next_pr()
        topic = b.rng.choice(TOPICS)
        if n == 0:
            # a kernel change landing on main after v0.27.0's cut: picked onto its branch
            # (without -x: only its patch id says what it copies)
            kernel_note(tree, pr, b.rng)
            head = marks["pick27"] = b.commit(
                "refs/heads/main", f"[Kernel] Comment RMSNorm {topic} path (#{pr})", tree, head)
        else:
            limit = plan.commits - 2 * RELEASE_COMMITS
            head = ordinary_commit(b, tree, head, pr, topic, True, limit)
        main_marks.append(head)


def _write(
    path: Path,
    b: Builder,
    planted: int,
    python: int,
    switch: int,
    broken: list[int],
    main_marks: list[int],
    marks: dict[str, int],
    branches: Callable[[Callable[[int], str]], None],
) -> DemoHistory:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", MAINLINE)
    marks_file = path / ".git" / "demo-marks"
    git(path, "fast-import", "--quiet", f"--export-marks={marks_file}", data=b"".join(b.out))
    sha = dict(line.split()[0:2] for line in marks_file.read_text().splitlines())

    def full(mark: int) -> str:
        return sha[f":{mark}"]

    b.out = []
    branches(full)
    git(path, "fast-import", "--quiet", f"--import-marks={marks_file}",
         f"--export-marks={marks_file}", data=b"".join(b.out))
    sha = dict(line.split()[0:2] for line in marks_file.read_text().splitlines())
    marks_file.unlink()
    git(path, "update-ref", "-d", "refs/heads/_branch")
    git(path, "checkout", "-q", "-f", MAINLINE)
    line = git(path, "rev-list", "--first-parent", "--reverse", GOOD_TAG).split()
    releases = {
        tag: tuple(git(path, "rev-list", "--reverse", tag, "--not", MAINLINE).split())
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

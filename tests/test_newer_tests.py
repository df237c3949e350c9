"""``bisect start --run CMD --test-from REF --test-file PATH`` (issue 40): a regression test that
exists only from a newer commit on, run against every candidate, on the demo history.

The test here is the demo fix's own regression test, as a maintainer would write it after
PR #48391: the first 255 rows of a 300-row launch of demollm's rms_norm against a 255-row
launch, bitwise, with VLLM_BATCH_INVARIANT=1. It is committed after v0.27.0, on a branch of its
own, so no candidate has it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from gitrepos import run_cli

from bisect_tool.demo.history import BAD_TAG, GOOD_TAG, DemoHistory, generate
from bisect_tool.errors import UsageError
from bisect_tool.range.newer_tests import ENV_FOLDER, export, place

TEST_FILE = "tests/test_rms_norm_pinned.py"
REGRESSION_TEST = '''\
"""#48391: with VLLM_BATCH_INVARIANT=1 a row normalises the same in any launch size."""
import array
import ctypes
import os
import random
import sys

os.environ["VLLM_BATCH_INVARIANT"] = "1"  # the kernels read it once, at their first call
lib = ctypes.CDLL(os.path.abspath("demollm/_kernels.so"))
f32p = ctypes.POINTER(ctypes.c_float)
lib.rms_norm.argtypes = [f32p, f32p, f32p, ctypes.c_float, ctypes.c_int64, ctypes.c_int64]
hidden, rng = 2048, random.Random(0)
x = array.array("f", (rng.gauss(0, 1) for _ in range(300 * hidden)))


def launch(n):
    out, inp = array.array("f", bytes(4 * n * hidden)), x[: n * hidden]
    ptr = lambda a: ctypes.cast((ctypes.c_float * len(a)).from_buffer(a), f32p)
    assert lib.rms_norm(ptr(out), ptr(inp), None, 1e-6, n, hidden) == 0
    return out


same = launch(300)[: 255 * hidden].tobytes() == launch(255).tobytes()
print("rows match" if same else "rows differ between launch sizes")
sys.exit(0 if same else 1)
'''
# A build that fails (the history has some) is untestable, not bad: exit 125.
RUN = f"python3 setup.py build_ext --inplace >/dev/null 2>&1 || exit 125; python3 {TEST_FILE}"


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoHistory, str]:
    """The demo history and the commit after v0.27.0 that adds the regression test."""
    h = generate(tmp_path_factory.mktemp("newer") / "repo", commits=80)
    repo = str(h.repo)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    git("checkout", "-q", "-b", "regression-test", GOOD_TAG)
    (h.repo / "tests").mkdir(exist_ok=True)
    (h.repo / TEST_FILE).write_text(REGRESSION_TEST)
    git("add", TEST_FILE)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m",
        "[Test] RMSNorm rows must not depend on the launch size (#48391)")
    sha = git("rev-parse", "HEAD")
    git("checkout", "-q", "--detach", GOOD_TAG)
    return h, sha


@pytest.mark.slow  # a whole bisect with a test from outside every candidate
def test_the_regression_test_finds_the_fix_from_outside_every_candidate(
    history: tuple[DemoHistory, str], tmp_path: Path
) -> None:
    h, test_commit = history
    state = tmp_path / "state"
    code, out, err = run_cli(
        "start", "--good", GOOD_TAG, "--bad", BAD_TAG, "--repo", str(h.repo), "--run", RUN,
        "--test-from", "regression-test", "--test-file", TEST_FILE, "--deterministic",
        "--state-dir", str(state), "-q",
    )
    assert code == 0, out + err
    assert f"first good commit: {h.planted_commit}" in out
    header = json.loads((state / "journal.jsonl").read_text().splitlines()[0])
    tests = header["test_from"]
    assert (tests["ref"], tests["sha"], tests["files"]) == (
        "regression-test", test_commit, [TEST_FILE])
    folder = Path(tests["folder"])
    assert folder.parent == state and (folder / TEST_FILE).read_text() == REGRESSION_TEST
    logs = "".join(p.read_text() for p in (state / "logs").glob("*.log"))
    assert f"(with {TEST_FILE} of regression-test {test_commit[:12]}" in logs
    assert "rows differ between launch sizes" in logs and "rows match" in logs
    # the candidates' own trees never held it: the file came from outside
    assert subprocess.run(["git", "-C", str(h.repo), "cat-file", "-e",
                           f"{h.planted_commit}:{TEST_FILE}"]).returncode != 0


def test_without_it_the_test_fails_at_every_candidate_for_the_wrong_reason(
    history: tuple[DemoHistory, str], tmp_path: Path
) -> None:
    h, _ = history
    code, out, err = run_cli(
        "start", "--good", GOOD_TAG, "--bad", BAD_TAG, "--repo", str(h.repo), "--run", RUN,
        "--deterministic", "--state-dir", str(tmp_path / "state"), "-q",
    )
    # the file is missing everywhere, so the good end "fails" too: the run stops (exit 9)
    assert code == 9, out + err
    logs = "".join(p.read_text() for p in (tmp_path / "state" / "logs").glob("*.log"))
    assert "can't open file" in logs


def test_bad_test_from_arguments_are_one_line_usage_errors(
    history: tuple[DemoHistory, str], tmp_path: Path
) -> None:
    h, _ = history
    with pytest.raises(UsageError, match="no such commit"):
        export(h.repo, "no-such-ref", (TEST_FILE,), tmp_path)
    with pytest.raises(UsageError, match=f"--test-file tests/nope.py is not in {GOOD_TAG}"):
        export(h.repo, GOOD_TAG, ("tests/nope.py",), tmp_path)
    with pytest.raises(UsageError, match="climbs out"):
        export(h.repo, "regression-test", ("../x.py",), tmp_path)
    for argv, fragment in (
        (["--test-from", "regression-test"], "go together"),
        (["--test-file", TEST_FILE], "go together"),
        (["--test-from", "regression-test", "--test-file", TEST_FILE, "--recipe", "demo"],
         "goes with --run"),
    ):
        code, out, err = run_cli("start", "--good", GOOD_TAG, "--bad", BAD_TAG, "--repo",
                                 str(h.repo), "--state-dir", str(tmp_path / "s"), *argv)
        assert code != 0 and fragment in err, (argv, err)


def test_the_files_replace_the_candidates_own_and_are_exported_once(
    history: tuple[DemoHistory, str], tmp_path: Path
) -> None:
    h, _ = history
    tests = export(h.repo, "regression-test", (TEST_FILE,), tmp_path)
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / TEST_FILE).write_text("# the candidate's older version\n")
    assert place(tests, tree) == [TEST_FILE]
    assert (tree / TEST_FILE).read_text() == REGRESSION_TEST
    assert ENV_FOLDER == "BISECT_TEST_FROM"
    assert export(h.repo, "regression-test", (TEST_FILE,), tmp_path).folder == tests.folder

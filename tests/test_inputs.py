"""Issue 30, off the happy path: nothing lost, bad input gets one line and its own exit code.

Each case is what a user would type; each asserts what the user would check afterwards (their
files still there, the one line on stderr, the exit status). docs/reliability.md lists them.
Recipes checked at load and the tool's own interpreter: tests/test_inputs_recipes.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from gitrepos import Repo, git, linear, run_cli

from bisect_tool import errors
from bisect_tool.errors import (
    CorruptJournal,
    NoSession,
    RangeError,
    ResetRefused,
    StateDirUnusable,
    UsageError,
)

ROOT = Path(__file__).resolve().parent.parent
N = 8
FLIP = 5
PROBE = f'[ "$(cat f)" -lt {FLIP} ]'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("inputs") / "repo", N, tag_every=4)


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("bisect: "), err
    return lines[0]


def start(repo: Repo, *extra: str) -> tuple[int, str, str]:
    return run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--run", PROBE,
                   "--repo", str(repo.path), "-q", *extra)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (``.git`` included) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


# ---- 1. reset deletes only what it can prove is its own ------------------------------------------


def test_reset_of_a_folder_of_the_users_keeps_every_file(repo: Repo, tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    (precious / "photos").mkdir(parents=True)
    (precious / "thesis.tex").write_text("five years of work")
    (precious / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    before = tree(precious)
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(precious))
    assert code == ResetRefused.exit_code
    line = one_line(err)
    assert "holds files bisect did not write (photos, thesis.tex)" in line
    assert "reset deletes nothing" in line
    assert tree(precious) == before
    assert sorted(p.name for p in precious.iterdir()) == ["photos", "thesis.tex"]  # no lock file


def test_reset_of_a_state_dir_that_also_holds_a_users_file_deletes_nothing(
    repo: Repo, tmp_path: Path
) -> None:
    state = tmp_path / "shared"
    code, _, err = start(repo, "--state-dir", str(state))
    assert code == 0, err
    (state / "notes.txt").write_text("mine")
    before = tree(state)
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == ResetRefused.exit_code and "(notes.txt)" in one_line(err)
    assert tree(state) == before


def test_reset_of_dot_inside_a_clone_keeps_the_checkout_and_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = linear(tmp_path / "clone", N, tag_every=4)
    code, _, err = start(clone)
    assert code == 0, err
    before = tree(clone.path)
    head = clone.git("rev-parse", "HEAD")
    for where, state_dir in ((clone.path, "."), (clone.path / "sub", ".."),
                             (clone.path, ".git"), (clone.path, str(tmp_path))):
        where.mkdir(exist_ok=True)
        monkeypatch.chdir(where)
        code, _, err = run_cli("reset", "--state-dir", state_dir)
        assert code == ResetRefused.exit_code, (state_dir, err)
        assert "reset deletes nothing" in one_line(err)
    assert tree(clone.path) == before
    assert clone.git("rev-parse", "HEAD") == head and clone.git("status", "--porcelain") == ""
    # the real state dir still goes
    monkeypatch.chdir(clone.path)
    code, out, err = run_cli("reset")
    assert code == 0, err
    assert f"removed {clone.path / '.git' / 'bisect-tool'}" in out
    assert not (clone.path / ".git" / "bisect-tool").exists()
    assert (clone.path / ".git" / "HEAD").is_file() and (clone.path / "f").is_file()


def test_reset_of_a_git_work_tree_given_as_state_dir(repo: Repo, tmp_path: Path) -> None:
    other = linear(tmp_path / "other", 3)
    before = tree(other.path)
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(other.path))
    assert code == ResetRefused.exit_code and "is a git work tree" in one_line(err)
    assert tree(other.path) == before


def test_reset_of_a_file_keeps_it(repo: Repo, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(afile))
    assert code == ResetRefused.exit_code
    assert f"--state-dir {afile} is a file, not a bisect state dir" in one_line(err)
    assert afile.read_text() == "keep me"


def test_reset_of_a_lookalike_journal_or_lock_deletes_nothing(repo: Repo, tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "journal.jsonl").write_text("my own jsonl data\n")
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(fake))
    assert code == ResetRefused.exit_code
    assert "journal.jsonl is not the journal bisect writes there" in one_line(err)
    (fake / "journal.jsonl").unlink()
    (fake / "lock").write_text("not filelock's")
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(fake))
    assert code == ResetRefused.exit_code and "lock is not the lock" in one_line(err)
    assert (fake / "lock").read_text() == "not filelock's"


def test_reset_of_a_real_state_dir_removes_it_with_its_logs(repo: Repo, tmp_path: Path) -> None:
    state = tmp_path / "st"
    code, _, err = start(repo, "--state-dir", str(state))
    assert code == 0, err
    (state / "logs").mkdir(exist_ok=True)
    (state / "logs" / "lifetime-1.log").write_text("a log the tool wrote")
    code, out, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert f"removed {state}" in out and not state.exists()
    assert tmp_path.is_dir()  # nothing above the state dir
    code, out, _ = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0 and "no bisect in progress" in out


def test_reset_of_a_corrupt_journal_still_removes_it(repo: Repo, tmp_path: Path) -> None:
    state = tmp_path / "st"
    code, _, err = start(repo, "--state-dir", str(state))
    assert code == 0, err
    with open(state / "journal.jsonl", "a") as fh:
        fh.write("{garbage\n{}\n")
    code, _, err = run_cli("status", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == CorruptJournal.exit_code
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert not state.exists()


# ---- 3. exit codes: one per kind of failure, the table from errors.py -------------------------


def test_each_kind_of_state_failure_has_its_own_exit_code(repo: Repo, tmp_path: Path) -> None:
    code, _, err = run_cli("status", "--repo", str(repo.path), "--state-dir",
                           str(tmp_path / "none"))
    assert code == NoSession.exit_code == 10 and "start one with `bisect start`" in one_line(err)
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = start(repo, "--state-dir", str(afile))
    assert code == StateDirUnusable.exit_code == 11 and "is a file, not a folder" in one_line(err)
    code, _, err = run_cli("status", "--repo", str(repo.path), "--state-dir", str(afile))
    assert code == StateDirUnusable.exit_code
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "journal.jsonl").write_text("[1, 2, 3]\n{}\n")
    code, _, err = run_cli("log", "--repo", str(repo.path), "--state-dir", str(bad))
    assert code == CorruptJournal.exit_code == 12 and "not a bisect journal" in one_line(err)
    codes = [c for c, _names, _m in errors.exit_codes()]
    assert len(codes) == len(set(codes)) and {0, 2, 5, 9, 10, 11, 12, 13} <= set(codes)


def test_readme_and_help_show_the_exit_codes_of_errors_py() -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- exit-codes[^>]*-->\n(.*?)\n<!-- /exit-codes -->", readme, re.S)
    assert found, "README.md lost its exit-code table markers"
    assert found.group(1) == errors.exit_code_table(), (
        "README.md's exit codes differ from bisect_tool/errors.py; paste "
        "`python -c 'from bisect_tool.errors import exit_code_table; print(exit_code_table())'`"
    )
    code, out, _ = run_cli("--help")
    assert code == 0
    for number, _names, meaning in errors.exit_codes():
        assert re.search(rf"^\s*{number}\s+{re.escape(meaning)}$", out, re.M), (number, out)


# ---- 2. bad input: one line, the right exit code, no traceback -----------------------------------


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--confidence", "nan"], "'--confidence': 'nan' is not a finite number"),
        (["--run-timeout", "inf"], "'--run-timeout': 'inf' is not a finite number"),
        (["--run-timeout", "nan"], "'--run-timeout': 'nan' is not a finite number"),
        (["--cost-new", "inf"], "'--cost-new': 'inf' is not a finite number"),
        (["--cost-lifetime", "nan"], "'--cost-lifetime': 'nan' is not a finite number"),
        (["--cost-new", "-1"], "'--cost-new': -1.0 is not in the range x>=0"),
        (["--max-evaluations", "0"], "'--max-evaluations': 0 is not in the range x>=1"),
    ],
)
def test_start_numbers_that_mean_nothing(
    repo: Repo, tmp_path: Path, argv: list[str], says: str
) -> None:
    code, _, err = start(repo, "--state-dir", str(tmp_path / "st"), *argv)
    assert code == UsageError.exit_code and says in one_line(err)
    assert not (tmp_path / "st" / "journal.jsonl").exists()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--repeats", "0"], "'--repeats': 0 is not in the range x>=1"),
        (["--narrow-cost", "-1", "--tiered"], "'--narrow-cost': -1.0 is not in the range x>=0"),
        (["--narrow-cost", "nan", "--tiered"], "'--narrow-cost': 'nan' is not a finite number"),
        (["--p", "nan"], "'--p': 'nan' is not a finite number"),
        (["--q", "-0.1"], "'--q': -0.1 is not in the range 0<=x<1"),
        (["--confidence", "inf"], "'--confidence': inf is not in the range 0.5<=x<1"),
        (["--cost-new", "-3"], "'--cost-new': -3.0 is not in the range x>=0"),
        (["--cost-lifetime", "0"], "'--cost-lifetime': 0.0 is not in the range x>0"),
        (["--trials", "0"], "'--trials': 0 is not in the range x>=1"),
        (["--candidates", "1"], "'--candidates' / '-n': 1 is not in the range x>=2"),
    ],
)
def test_simulate_numbers_that_mean_nothing(argv: list[str], says: str) -> None:
    code, out, err = run_cli("simulate", "--trials", "1", "-n", "8", *argv)
    assert code == UsageError.exit_code and says in one_line(err) and not out


@pytest.mark.parametrize(
    "argv, says",
    [
        (["locate", "--good", "a", "--bad", "b", "--recipe", "demo", "--confidence", "nan"],
         "'--confidence': 'nan' is not a finite number"),
        (["probe", "--server", "http://127.0.0.1:1", "--repeats", "1"],
         "'--repeats': 1 is not in the range x>=2"),
        (["probe", "--server", "http://127.0.0.1:1", "--jitter-ms", "nan"],
         "'--jitter-ms': 'nan' is not a finite number"),
        (["probe", "--server", "http://127.0.0.1:1", "--requests", "0"],
         "'--requests': 0 is not in the range x>=1"),
        (["probe", "--server", "http://127.0.0.1:1", "--max-tokens", "-2"],
         "'--max-tokens': -2 is not in the range x>=1"),
        (["probe", "--server", "http://127.0.0.1:1", "--fillers", "-1"],
         "'--fillers': -1 is not in the range x>=0"),
        (["artifacts", "gc", "--max-bytes", "-1"], "'--max-bytes': -1 is not in the range x>=0"),
        (["demo", "--commits", "0"], "the demo history needs at least 60 commits, got 0"),
    ],
)
def test_other_commands_numbers_that_mean_nothing(argv: list[str], says: str) -> None:
    code, out, err = run_cli(*argv)
    assert code == UsageError.exit_code and says in one_line(err)


def test_report_to_a_path_that_cannot_be_written(repo: Repo, tmp_path: Path) -> None:
    state = tmp_path / "st"
    code, _, err = start(repo, "--state-dir", str(state))
    assert code == 0, err
    for target in ("/proc/nope.md", str(tmp_path)):
        code, out, err = run_cli("report", "-o", target, "--repo", str(repo.path),
                                 "--state-dir", str(state))
        assert code == UsageError.exit_code, err
        assert f"cannot write the report to {target}" in one_line(err)


# ---- from a subdirectory of the clone, or a linked worktree --------------------------------------


def test_commands_from_a_subdirectory_find_the_clone_as_git_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = linear(tmp_path / "clone", N, tag_every=4)
    deep = clone.path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    code, out, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--run", PROBE,
                             "-q")
    assert code == 0, err
    assert f"first bad commit: {clone.main[FLIP - 1]}" in out
    assert (clone.path / ".git" / "bisect-tool" / "journal.jsonl").is_file()
    assert not (deep / ".git").exists()
    header = json.loads((clone.path / ".git/bisect-tool/journal.jsonl").read_text().split("\n")[0])
    assert Path(header["repo"]) == clone.path
    code, out, err = run_cli("status")
    assert code == 0 and "top candidate: " + clone.main[FLIP - 1] in out, err
    # --repo may name a folder inside the clone, too
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("log", "--repo", str(deep))
    assert code == 0 and out.startswith("# session "), err


def test_a_linked_worktree_keeps_its_own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    clone = linear(tmp_path / "clone", N, tag_every=4)
    linked = tmp_path / "linked"
    git(clone.path, "worktree", "add", "-q", "--detach", str(linked), "v0.2.0")
    (linked / "sub").mkdir()
    monkeypatch.chdir(linked / "sub")
    code, out, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--run", PROBE,
                             "-q")
    assert code == 0, err
    git_dir = Path(subprocess.run(["git", "rev-parse", "--absolute-git-dir"], cwd=linked,
                                  capture_output=True, text=True, check=True).stdout.strip())
    assert (git_dir / "bisect-tool" / "journal.jsonl").is_file()
    assert not (clone.path / ".git" / "bisect-tool").exists()


def test_outside_any_clone_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BISECT_STATE_DIR", str(tmp_path / "user-state"))
    code, _, err = run_cli("status")
    assert code == RangeError.exit_code
    assert "is not a git repository (nor inside one); pass --repo PATH" in one_line(err)


@pytest.mark.parametrize("url, says", [
    ("http://[::1", "is not a valid URL (Invalid IPv6 URL)"),
    ("http://localhost:99999", "is not a valid URL (Port out of range 0-65535)"),
    ("http://127.0.0.1:0", "port 0 cannot be connected to"),
    ("localhost:8000", "must be an http(s) URL with a host"),
    ("http://:8000", "must be an http(s) URL with a host"),
])
def test_probe_server_url_that_cannot_be_used(url: str, says: str) -> None:
    code, out, err = run_cli("probe", "--server", url)
    assert code == UsageError.exit_code and says in one_line(err) and not out


def test_extract_to_a_file_blames_the_output_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zipfile

    wheel = tmp_path / "x.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/a.so", b"kernel")
    afile = tmp_path / "out.txt"
    afile.write_text("mine")
    code, _, err = run_cli("artifacts", "extract", str(wheel), "--member", "pkg/a.so",
                           "--out", str(afile))
    assert code == UsageError.exit_code
    line = one_line(err)
    assert f"--out {afile}: {afile} is a file, not a folder" in line and "wheel" not in line
    assert afile.read_text() == "mine"
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "pkg").write_text("in the way")
    code, _, err = run_cli("artifacts", "extract", str(wheel), "--member", "pkg/a.so",
                           "--out", str(tmp_path / "o"))
    assert code == UsageError.exit_code and "o/pkg is a file, not a folder" in one_line(err)
    code, _, err = run_cli("artifacts", "extract", str(wheel), "--member", "pkg/a.so",
                           "--out", "/proc/nope")
    assert code == UsageError.exit_code and "--out /proc/nope: cannot make" in one_line(err)
    code, out, err = run_cli("artifacts", "extract", str(wheel), "--member", "pkg/a.so",
                             "--out", str(tmp_path / "good"))
    assert code == 0 and (tmp_path / "good/pkg/a.so").read_bytes() == b"kernel", err

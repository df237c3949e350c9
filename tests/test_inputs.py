"""Issue 30, off the happy path: nothing lost, bad input gets one line and its own exit code.

Each case is what a user would type; each asserts what the user would check afterwards (their
files still there, the one line on stderr, the exit status). docs/reliability.md lists them.
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


# ---- recipes: checked whole at load; a bundled name is never shadowed by a folder -------------


def _recipe(tmp_path: Path, body: str | bytes) -> Path:
    path = tmp_path / "r.toml"
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text(body)
    return path


@pytest.mark.parametrize("body, says", [
    ('[search]\nend_doubt = 2.0\n', "'search.end_doubt' must be in [0, 0.5), got 2.0"),
    ('[search]\nend_doubt = 0.5\n', "'search.end_doubt' must be in [0, 0.5), got 0.5"),
    ('[search]\nconfidence = nan\n', "'search.confidence' must be a finite number, got nan"),
    ('[search]\ncost_lifetime = inf\n', "'search.cost_lifetime' must be a finite number"),
    ('[probe]\nkind = "serve"\n', "'probe.kind' must be one of 'server', 'op', got 'serve'"),
    ('[runtime]\nbackend = "podman"\n', "'runtime.backend' must be one of 'local', 'docker'"),
    ('[runtime]\ndocker_gpu = "all"\n', "'runtime.docker_gpu' must be one of"),
    ('[runtime]\ngpus = ["0", "0"]\n', "'runtime.gpus' lists a GPU twice"),
    ('[artifacts]\nbuild_executor = "podman"\n', "'artifacts.build_executor' must be one of"),
    ('[artifacts]\nsources = ["pypi"]\n', "'artifacts.sources' lists unknown source 'pypi'"),
    ('[probe]\nrequests = 4\nfillers = 2\ntarget_coresidency = 9\n',
     "'probe.target_coresidency' (9) exceeds requests + fillers (6)"),
    ('[probe]\nrow_counts = [300, 255]\n', "'probe.row_counts' must be [small, big]"),
])
def test_a_recipe_is_checked_whole_before_anything_starts(
    repo: Repo, tmp_path: Path, body: str, says: str
) -> None:
    recipe = _recipe(tmp_path, 'name = "r"\n' + body)
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--recipe",
                           str(recipe), "--repo", str(repo.path), "--state-dir",
                           str(tmp_path / "st"))
    assert code == errors.RecipeError.exit_code
    assert f"{recipe}: " in one_line(err) and says in one_line(err), err
    assert not (tmp_path / "st" / "journal.jsonl").exists()


def test_every_search_value_the_journal_or_the_strategy_refuses_is_refused_at_load(
    tmp_path: Path,
) -> None:
    """The recipe check covers what the header check (entries.check_header) and the strategy would
    refuse later: a recipe that loads always gives a journal the tool can read back."""
    from bisect_tool.entries import _SEARCH_NUMBERS, ShapeError, check_header
    from bisect_tool.recipe import from_dict
    from bisect_tool.strategy import BayesianStrategy, Priors
    from bisect_tool.values import Direction

    values = (-1, 0, 0.001, 0.3, 0.5, 0.9999, 1, 2.0, 1e300, float("nan"), float("inf"))
    for key in _SEARCH_NUMBERS:
        for v in values:
            header = {"candidates": [{"sha": "a"}, {"sha": "b"}], "direction": "regression",
                      "recipe": {"search": {key: v}}}
            try:
                check_header(header)
                later_ok = True
            except ShapeError:
                later_ok = False
            if key == "end_doubt":
                try:
                    BayesianStrategy(3, Direction.REGRESSION, priors=Priors(end_doubt=v))
                except (ValueError, OverflowError):
                    later_ok = False
            try:
                from_dict({"name": "r", "search": {key: v}})
                loads = True
            except errors.RecipeError:
                loads = False
            assert later_ok or not loads, f"[search] {key} = {v} loads but fails later"


def test_a_recipe_that_is_not_utf8_is_one_line(repo: Repo, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, b'name = "r"\ndescription = "caf\xe9"\n')
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--recipe",
                           str(recipe), "--repo", str(repo.path))
    assert code == errors.RecipeError.exit_code
    assert f"{recipe}:2: not UTF-8 text (byte 0xe9)" in one_line(err)


def test_a_folder_named_like_a_bundled_recipe_does_not_shadow_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bisect_tool import recipe as recipe_mod
    from bisect_tool.demo.cli import write_recipe

    for name in ("demo", "batch-invariance", "demo-op"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    assert recipe_mod.load("demo").name == "demo"
    assert recipe_mod.load("batch-invariance").source == str(
        recipe_mod.BUNDLED_DIR / "batch-invariance.toml")
    written = write_recipe(tmp_path / "demo-recipe.toml", tmp_path / "cache")  # `bisect demo`
    assert recipe_mod.load(str(written)).name == "demo"
    # a path is a path when it looks like one
    (tmp_path / "mine.toml").write_text('name = "mine"\n')
    (tmp_path / "plain").write_text('name = "plain"\n')
    assert recipe_mod.load("mine.toml").name == "mine"
    assert recipe_mod.load("./plain").name == "plain"
    with pytest.raises(errors.RecipeError, match="for the file plain here, write ./plain"):
        recipe_mod.load("plain")
    with pytest.raises(errors.RecipeError, match="recipe demo is a folder; give the .toml file"):
        recipe_mod.load("demo/")


def test_artifact_sources_known_to_the_recipe_check_are_the_providers() -> None:
    from bisect_tool.artifacts import KNOWN_SOURCES
    from bisect_tool.limits import ARTIFACT_SOURCES

    assert tuple(ARTIFACT_SOURCES) == tuple(KNOWN_SOURCES)


# ---- 5. the tool's own interpreter, not whatever python3 is first on PATH -------------------


@pytest.fixture()
def foreign_python3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``python3`` first on PATH that lacks numpy (and everything else): it fails as such an
    interpreter does when a server, a build or the op check's child needs its packages."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python3", "python"):
        fake = bin_dir / name
        fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'numpy'\" >&2\n"
                        "exit 1\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    assert subprocess.run(["python3", "-c", "1"], capture_output=True).returncode == 1
    return bin_dir / "python3"


@pytest.mark.slow
def test_demo_build_lifetime_and_op_check_run_under_the_tools_own_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, foreign_python3: Path
) -> None:
    import sys

    from bisect_tool.demo import pinned
    from bisect_tool.demo.cli import write_recipe
    from bisect_tool.demo.history import generate

    history = generate(tmp_path / "demo-repo", commits=60)
    pinned.ensure_pinned_build()
    recipe = write_recipe(tmp_path / "demo.toml", tmp_path / "cache")
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    # a host build (python3 setup.py ...) and one server lifetime of the fixed release
    code, out, err = run_cli("probe", "--commit", history.good_tag, "--recipe", str(recipe),
                             "--repo", str(history.repo), "--lifetimes", "1")
    assert "UNTESTABLE" not in out, out + err
    assert code == 0 and "\nCLEAN: " in out, out + err
    # the op check's child on the same build (the demo-op recipe names no interpreter now)
    text = re.sub(r"(?m)^\[artifacts\]$", f'[artifacts]\ncache_dir = "{tmp_path / "cache"}"',
                  (ROOT / "bisect_tool/recipes/demo-op.toml").read_text())
    (tmp_path / "demo-op.toml").write_text(text)
    code, out, err = run_cli("probe", "--commit", history.good_tag, "--recipe",
                             str(tmp_path / "demo-op.toml"), "--repo", str(history.repo),
                             "--json")
    assert code == 0, out + err
    probed = json.loads(out)
    assert probed["verdict"] == "clean", probed
    assert probed["lifetimes"][0]["detail"]["python"] == sys.executable


def test_the_report_names_the_interpreter_that_ran(
    repo: Repo, tmp_path: Path, foreign_python3: Path
) -> None:
    import sys

    recipe = _recipe(tmp_path, 'name = "r"\n[artifacts]\nsources = ["local"]\n'
                     'swap_set = ["pkg/_k.so"]\n'
                     f'cache_dir = "{tmp_path / "cache"}"\n')
    state = tmp_path / "st"
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--recipe",
                           str(recipe), "--no-controls", "--repo", str(repo.path),
                           "--state-dir", str(state))
    assert code == errors.NoAnswer.exit_code, err  # no source serves a commit: untestable ends
    entries = [json.loads(line) for line in (state / "journal.jsonl").read_text().splitlines()]
    env = next(e for e in entries if e.get("type") == "environment")
    assert env["interpreter"] == sys.executable
    version = ".".join(map(str, sys.version_info[:3]))
    assert env["python"] == f"{version} (the tool's own, {sys.executable})"
    code, report, err = run_cli("report", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    # named, without the directories it sits in on this machine (a pasted report names none)
    assert f"| Python | {version} (the tool's own, {Path(sys.executable).name}) |" in report
    # --python names another that cannot answer: the preflight refuses before anything runs,
    # naming that interpreter and the fix, and leaves no session behind
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--recipe",
                           str(recipe), "--no-controls", "--python", str(foreign_python3),
                           "--repo", str(repo.path), "--state-dir", str(tmp_path / "st2"))
    assert code == errors.InfrastructureError.exit_code, err
    assert f"{foreign_python3} does not run" in err and "--python" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "st2" / "journal.jsonl").exists()


def test_completion_offers_bundled_names_unless_the_word_looks_like_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bisect_tool.completion import complete_recipe

    (tmp_path / "demo").mkdir()
    monkeypatch.chdir(tmp_path)
    offered = complete_recipe(None, None, "dem")  # type: ignore[arg-type]
    assert [c.value for c in offered] == ["demo", "demo-op", "demo-python"]
    assert all(c.type == "plain" for c in offered)
    for typed in ("demo/", "./de", "x.toml"):
        assert [(c.value, c.type) for c in complete_recipe(None, None, typed)] == [  # type: ignore[arg-type]
            (typed, "file")]

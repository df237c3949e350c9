"""Issue 30, off the happy path (tests/test_inputs.py), for recipes: checked whole at load, a
bundled name never shadowed by a folder; and the tool's own interpreter, not whatever python3
is first on PATH."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from gitrepos import Repo, linear, run_cli
from test_inputs import ROOT, N, one_line

from bisect_tool import errors


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("inputs") / "repo", N, tag_every=4)


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
    ('[search]\nclean_against_rate = 0\n',
     "'search.clean_against_rate' must be in (0, 1), got 0.0; give the lowest share of lifetimes"),
    ('[search]\nclean_against_rate = 1.0\n',
     "'search.clean_against_rate' must be in (0, 1), got 1.0; give the lowest share"),
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
    """The recipe check covers what the header check (shapes.check_header) and the strategy would
    refuse later: a recipe that loads always gives a journal the tool can read back."""
    from bisect_tool.journal.shapes import _SEARCH_NUMBERS, ShapeError, check_header
    from bisect_tool.recipes.recipe import from_dict
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
    from bisect_tool.demo.cli import write_recipe
    from bisect_tool.recipes import recipe as recipe_mod

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
    from bisect_tool.recipes.limits import ARTIFACT_SOURCES

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
    from bisect_tool.recipes.completion import complete_recipe

    (tmp_path / "demo").mkdir()
    monkeypatch.chdir(tmp_path)
    offered = complete_recipe(None, None, "dem")  # type: ignore[arg-type]
    assert [c.value for c in offered] == ["demo", "demo-op", "demo-python"]
    assert all(c.type == "plain" for c in offered)
    for typed in ("demo/", "./de", "x.toml"):
        assert [(c.value, c.type) for c in complete_recipe(None, None, typed)] == [  # type: ignore[arg-type]
            (typed, "file")]

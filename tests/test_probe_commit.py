"""`bisect probe --commit REF`: one candidate of the demo history through the real stages (source
build on the host, the extension swapped into the pinned demollm stack, fresh server lifetimes,
the determinism probe), printed as tables; exit status = the aggregate verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_tool.cli import main
from bisect_tool.demo import pinned
from bisect_tool.demo.cli import write_recipe
from bisect_tool.demo.history import DemoHistory, generate
from bisect_tool.values import Verdict
from bisect_tool.verdict import aggregate


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoHistory, Path]:
    root = tmp_path_factory.mktemp("probe-commit")
    history = generate(root / "repo", commits=80)
    pinned.ensure_pinned_build()
    recipe = write_recipe(root / "demo-recipe.toml", root / "cache")
    return history, recipe


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def probe_argv(demo: tuple[DemoHistory, Path], ref: str, *extra: str) -> list[str]:
    history, recipe = demo
    return ["probe", "--commit", ref, "--recipe", str(recipe), "--repo", str(history.repo),
            *extra]


@pytest.mark.slow
def test_pre_fix_commit_prints_one_table_per_lifetime(
    demo: tuple[DemoHistory, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    history, _ = demo
    code, out, err = run(probe_argv(demo, history.bad_tag, "--lifetimes", "2"), capsys)
    # The pre-fix kernel diverges only in some lifetimes: any verdict but UNTESTABLE is right.
    assert code in (0, 1, 2), out + err
    assert out.count("== lifetime ") == 2
    assert out.count("| distinct outputs / repeats |") == 2
    assert "| co-residency reached (per repeat) |" in out
    verdict = {0: "CLEAN", 1: "DIVERGENT", 2: "INCONCLUSIVE"}[code]
    assert f"\n{verdict}: " in out and f"({history.bad_tag}): 2 lifetimes" in out


@pytest.mark.slow
def test_controls_on_the_fixed_commit_print_both(
    demo: tuple[DemoHistory, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    history, _ = demo
    code, out, err = run(
        probe_argv(demo, history.good_tag, "--controls", "--lifetimes", "0"), capsys
    )
    assert "== positive control (must be divergent): " in out, out + err
    assert "== negative control (must be clean): " in out
    assert out.count("| distinct outputs / repeats |") == 2
    # Exit 0 exactly when both controls held (printed as "controls: ok").
    assert (code == 0) == ("\ncontrols: ok\n" in out), out
    assert code in (0, 2)


@pytest.mark.slow
def test_json_names_the_commit_and_each_lifetime(
    demo: tuple[DemoHistory, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    history, _ = demo
    code, out, _ = run(probe_argv(demo, history.good_tag, "--json"), capsys)
    data = json.loads(out)
    assert len(data["commit"]) == 40 and data["ref"] == history.good_tag
    assert [entry["verdict"] for entry in data["lifetimes"]] == [data["verdict"]]
    assert data["lifetimes"][0]["detail"]["lifetime_id"].endswith("-probe-0")
    assert code == {"clean": 0, "divergent": 1, "inconclusive": 2, "untestable": 3}[data["verdict"]]


def test_broken_commit_is_untestable_exit_3(
    demo: tuple[DemoHistory, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    history, _ = demo
    broken = history.broken_commits[0]
    code, out, _ = run(probe_argv(demo, broken), capsys)
    assert code == 3, out
    assert "UNTESTABLE" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--commit", "v0.2.6"], "unknown ref 'v0.2.6'; did you mean"),
        (["--commit", "v0.26.0", "--lifetimes", "0"], "--lifetimes 0 probes nothing"),
        (["--server", "http://127.0.0.1:1", "--controls"], "go with --commit REF"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(
    demo: tuple[DemoHistory, Path],
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    history, recipe = demo
    code, _, err = run(
        ["probe", *extra, "--recipe", str(recipe), "--repo", str(history.repo)], capsys
    )
    assert code != 0 and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ([Verdict.CLEAN, Verdict.DIVERGENT, Verdict.UNTESTABLE], Verdict.DIVERGENT),
        ([Verdict.CLEAN, Verdict.CLEAN], Verdict.CLEAN),
        # INCONCLUSIVE is no evidence and a later crash says nothing: the search's own rule
        ([Verdict.CLEAN, Verdict.INCONCLUSIVE], Verdict.CLEAN),
        ([Verdict.CLEAN, Verdict.UNTESTABLE], Verdict.CLEAN),
        ([Verdict.INCONCLUSIVE, Verdict.UNTESTABLE], Verdict.INCONCLUSIVE),
        ([Verdict.UNTESTABLE, Verdict.UNTESTABLE], Verdict.UNTESTABLE),
        ([], Verdict.INCONCLUSIVE),
    ],
)
def test_aggregate_over_lifetimes(verdicts: list[Verdict], expected: Verdict) -> None:
    assert aggregate(verdicts) is expected

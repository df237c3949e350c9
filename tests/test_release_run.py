"""`bisect start --releases` end to end (issue 16): a real simple index on loopback holding real
demollm wheels (tests/wheelindex.py), real server lifetimes of the pinned demo stack with each
release's compiled kernel swapped in, the report's next step, offline from the cache, and the
hand-over to the commits between the two releases in a clone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from gitrepos import run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.demo import pinned
from bisect_tool.demo.cli import write_recipe

pytestmark = pytest.mark.slow


def release_recipe(tmp_path: Path, cache: Path, *, narrow: bool = False) -> Path:
    """The demo recipe as a release-level bisect of the package ``demollm``: release wheels
    first (source builds stay for the commit level the run may go on to)."""
    pinned.ensure_pinned_build()
    path = write_recipe(tmp_path / "demo-releases.toml", cache)
    text = path.read_text()
    text = re.sub(r'(?m)^sources = .*$', 'sources = ["release", "source-build"]', text)
    if not narrow:
        text = re.sub(r'(?m)^narrow = .*$', "", text)
    path.write_text(text)
    return path


def _journal(state: Path) -> journal_mod.JournalContents:
    return journal_mod.read(state / journal_mod.JOURNAL_NAME)


def test_releases_find_the_first_good_release_and_say_what_was_left_out(
    tmp_path: Path, demollm_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bad end 0.25.0 is one the pinned stack rejects (its rms_norm schema is the old one):
    UNTESTABLE with the op named, and the nearest testable release stands in for it."""
    monkeypatch.setenv("PIP_INDEX_URL", demollm_index.index_url)
    cache = tmp_path / "cache"
    recipe = release_recipe(tmp_path, cache)
    state = tmp_path / "state"
    code, out, err = run_cli(
        "start", "--releases", "--good", "0.27.0", "--bad", "v0.25.0", "--recipe", str(recipe),
        "--state-dir", str(state), "-q",
    )
    assert code == 0, err
    assert "first good release: v0.27.0" in out
    contents = _journal(state)
    header = contents.header
    assert header["level"] == "release" and header["repo"] == ""
    ids = [c["sha"] for c in header["candidates"]]
    assert ids == ["demollm-0.25.0", "demollm-0.25.1", "demollm-0.26.0", "demollm-0.27.0"]
    assert sorted(v for v, _ in header["left_out"]) == ["0.26.1", "0.27.0rc1"]
    # 0.25.0's extension declares the old rms_norm schema: the gate's sweep refuses it before
    # any server boots (issue 39), an untestable entry naming the op; no lifetime ran there
    refused = [e for e in contents.of_type("untestable") if e["commit"] == "demollm-0.25.0"]
    assert len(refused) == 1 and refused[0]["stage"] == "gate"
    assert "_C::rms_norm" in refused[0]["message"]
    assert not [o for o in contents.observations if o["commit"] == "demollm-0.25.0"]
    code, report, err = run_cli("report", "--state-dir", str(state))
    assert code == 0, err
    assert "0.27.0" in report.splitlines()[0]
    # the next step: the commits between the two releases, ready to paste
    assert "bisect start --good v0.27.0 --bad v0.26.0 --recipe" in report
    assert "0.26.1 (yanked: broken build)" in report and "0.27.0rc1 (pre-release)" in report
    # why 0.25.0 could not be tested: the gate's refusal, the op named whole (as code)
    refused = next(line for line in report.splitlines() if line.startswith("- `v0.25.0` could"))
    assert "the pinned stack's gate refused its" in refused and refused.endswith(
        "_kernels.so`: `_C::rms_norm`.")
    assert "**First good release**" in report

    # Offline: the listing and the swap sets come from the cache; the index is never asked.
    demollm_index.stop()
    before = sum(demollm_index.gets.values())
    offline = tmp_path / "offline"
    code, out, err = run_cli(
        "start", "--releases", "--good", "0.27.0", "--bad", "0.25.0", "--recipe", str(recipe),
        "--state-dir", str(offline), "-q",
    )
    assert code == 0, err
    assert "first good release: v0.27.0" in out
    assert _journal(offline).header["listing_source"] == "cache"
    assert sum(demollm_index.gets.values()) == before


def test_releases_given_the_other_way_round_stop_without_naming_one(
    tmp_path: Path, demollm_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--good older than --bad asks for the first bad release (a regression); here the newer
    end is the fixed one, so its lifetimes never diverge and no release is named."""
    monkeypatch.setenv("PIP_INDEX_URL", demollm_index.index_url)
    recipe = release_recipe(tmp_path, tmp_path / "cache")
    state = tmp_path / "state"
    code, out, err = run_cli(
        "start", "--releases", "--good", "0.26.0", "--bad", "0.27.0", "--recipe", str(recipe),
        "--state-dir", str(state), "-q",
    )
    assert code == 9, (out, err)
    header = _journal(state).header
    assert header["direction"] == "regression"
    end = _journal(state).end or {}
    assert end["state"] in ("ends_contradict", "bad_end_never_reproduced")
    assert "demollm-0.27.0" in end["message"]


def test_releases_the_other_way_round_stop_in_two_op_checks_with_a_fast_probe(
    tmp_path: Path, demollm_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: with the op check, ends given the wrong way round stop before any server
    boots: one op run at each end, exit 9, a line naming what each end showed and the swap."""
    monkeypatch.setenv("PIP_INDEX_URL", demollm_index.index_url)
    recipe = release_recipe(tmp_path, tmp_path / "cache", narrow=True)
    state = tmp_path / "state"
    code, out, err = run_cli(
        "start", "--releases", "--good", "0.26.0", "--bad", "0.27.0", "--recipe", str(recipe),
        "--state-dir", str(state), "-q",
    )
    assert code == 9, (out, err)
    contents = _journal(state)
    end = contents.end or {}
    assert end["state"] == "ends_contradict"
    assert "wrong way round" in end["message"] and "--good v0.27.0 --bad v0.26.0" in end["message"]
    assert [o.get("tier") for o in contents.observations] == ["narrow", "narrow"]
    assert not contents.of_type("controls")


def test_unknown_release_is_one_line_naming_the_nearest(
    tmp_path: Path, demollm_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", demollm_index.index_url)
    recipe = release_recipe(tmp_path, tmp_path / "cache")
    code, out, err = run_cli(
        "start", "--releases", "--good", "0.27.5", "--bad", "0.24.0", "--recipe", str(recipe),
        "--state-dir", str(tmp_path / "state"),
    )
    assert code == 3
    assert err.count("\n") == 1 and "0.27.5" in err and "0.28.0" in err
    assert "Traceback" not in err


def test_releases_with_a_clone_go_on_to_its_commits(
    tmp_path: Path, demollm_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --repo, the run ends at the planted commit of the demo history, having carried the
    lifetimes of 0.27.0 over to the commit its tag names. 0.26.0's are not carried: its tag is
    on its own release branch (vLLM's shape), and the commit run's old end is the tags' merge
    base, another commit, tested afresh as git tests it first (issue 37)."""
    from bisect_tool.demo.history import generate

    monkeypatch.setenv("PIP_INDEX_URL", demollm_index.index_url)
    history = generate(tmp_path / "repo", commits=80)
    # tiered (the op check narrows first) at both levels
    recipe = release_recipe(tmp_path, tmp_path / "cache", narrow=True)
    state = tmp_path / "state"
    code, out, err = run_cli(
        "start", "--releases", "--good", "0.27.0", "--bad", "0.26.0", "--recipe", str(recipe),
        "--repo", str(history.repo), "--state-dir", str(state), "-q",
    )
    assert code == 0, err
    assert history.planted_commit in out
    released = journal_mod.read(state / "releases.jsonl")
    commits = _journal(state)
    assert released.header["level"] == "release" and commits.header.get("level") is None
    assert commits.header["previous"]["flip"] == "demollm-0.27.0"
    carried = [o for o in commits.observations if o.get("carried_from")]
    assert {o["carried_from"] for o in carried} == {"demollm-0.27.0"}
    release_lifetimes = [o for o in released.observations if o["commit"] == "demollm-0.27.0"]
    assert len(carried) == len(release_lifetimes)
    assert commits.header["merge_base"] == history.merge_base
    assert any(o["commit"] == history.merge_base and not o.get("carried_from")
               for o in commits.observations)
    # both levels narrowed with the op check; the tiers of the carried runs are kept
    assert [p["phase"] for p in released.of_type("phase")][0] == "confirm"
    assert {o.get("tier", "faithful") for o in carried} <= {"narrow", "faithful"}
    shas = {c["sha"] for c in commits.header["candidates"]}
    assert {o["commit"] for o in carried} <= shas
    code, report, err = run_cli("report", "--state-dir", str(state), "--format", "json")
    assert code == 0, err
    assert json.loads(report)["previous"]["flip_label"] == "demollm-0.27.0"


def test_locate_over_releases_takes_python_sides_from_the_wheels(
    tmp_path: Path, demollm_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bisect locate --releases`: each end's Python side is its wheel minus the swap set, with
    its own extension; the fix lives in the compiled side."""
    monkeypatch.setenv("PIP_INDEX_URL", demollm_index.index_url)
    recipe = release_recipe(tmp_path, tmp_path / "cache")
    state = tmp_path / "state"
    code, out, err = run_cli(
        "locate", "--releases", "--good", "0.27.0", "--bad", "0.26.0", "--recipe", str(recipe),
        "--state-dir", str(state), "--json", "-q", "--confidence", "0.99",
        "--lifetimes-per-cell", "48",
    )
    assert code == 0, err
    found = json.loads(out)
    assert found["explanation"] == "compiled" and found["decided"]
    # adjacent releases: the next step is the commit-level bisect between them, in a clone
    # (issue 32, item 6), with the recipe this run used
    assert "the commits between" in found["next"]
    assert f"bisect start --good v0.27.0 --bad v0.26.0 --recipe {recipe}" in found["next"]
    assert "--releases" not in found["next"]
    stacks = sorted(p.name for p in (tmp_path / "cache" / "stacks").iterdir())
    assert stacks == ["demollm-0.26.0-demo", "demollm-0.27.0-demo"]
    for name in stacks:
        assert (tmp_path / "cache" / "stacks" / name / "demollm" / "_kernels.so").is_file()
        assert (tmp_path / "cache" / "stacks" / name / "demollm" / "server.py").is_file()

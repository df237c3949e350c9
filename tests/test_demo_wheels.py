"""The demo history's per-commit wheel index (bisect_tool.demo.wheels), as vLLM's CI publishes
one (vllm-facts.md): main's commits only, none that does not build, the default folder in the
CUDA its pipeline names (12.9, then 13.0 from the switch, vLLM #39878), a variant folder for the
other, and a few commits before the switch without a cu130 build. Real HTTP on loopback, real
wheels built from the commits' own sources, the real provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_tool.artifacts import make_provider
from bisect_tool.demo.history import DemoHistory, generate
from bisect_tool.demo.pinned import SWAP_PATH
from bisect_tool.demo.wheels import demo_host, hosted_commits
from bisect_tool.errors import ArtifactUnavailable
from bisect_tool.recipes.recipe import ArtifactSettings


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> DemoHistory:
    return generate(tmp_path_factory.mktemp("wheels") / "repo", commits=120)


def test_the_index_holds_what_vllms_ci_would_have_published(history: DemoHistory) -> None:
    hosted = {h.commit: h for h in hosted_commits(history)}
    release = {c for commits in history.release_commits.values() for c in commits}
    assert not set(hosted) & release  # a release branch's commits: none (#16217)
    assert not set(hosted) & set(history.broken_commits)  # a build that failed: nothing
    assert set(hosted) == set(history.main_commits) - set(history.broken_commits)
    switch = history.main_commits.index(history.cuda_switch)
    defaults = [hosted[c].default for c in history.main_commits if c in hosted]
    before = [c for c in history.main_commits[:switch] if c in hosted]
    assert defaults == ["cu129"] * len(before) + ["cu130"] * (len(defaults) - len(before))
    assert any("cu130" not in hosted[c].variants for c in before)  # a variant missing
    assert all(hosted[c].variants == ("cu129", "cu130") for c in hosted if c not in before)


def _provider(history: DemoHistory, url: str, cache: Path, sources: tuple[str, ...]):  # type: ignore[no-untyped-def]
    settings = ArtifactSettings(sources=sources, swap_set=(SWAP_PATH,), package="demollm",
                                wheel_index_url=url, variant="cu130", cache_dir=str(cache),
                                build_executor="host",
                                build_command="python3 setup.py build_ext --inplace")
    return make_provider(settings, history.repo)


def test_a_candidate_comes_from_its_cu130_folder_or_says_why_not(
    history: DemoHistory, tmp_path: Path
) -> None:
    hosted = {h.commit: h for h in hosted_commits(history)}
    switch = history.main_commits.index(history.cuda_switch)
    before = next(c for c in history.main_commits[:switch] if c in hosted
                  and "cu130" in hosted[c].variants)
    missing = next(c for c in history.main_commits[:switch] if c in hosted
                   and "cu130" not in hosted[c].variants)
    after = next(c for c in history.main_commits[switch:] if c in hosted)
    tail = history.release_commits["v0.27.0"][1]
    with demo_host(history, tmp_path / "wheels") as host, \
            _provider(history, host.url, tmp_path / "cache", ("wheel-index",)) as provider:
        for commit in (before, after):
            swap = provider.get(commit)
            assert Path(swap.files[SWAP_PATH]).read_bytes()[:4] == b"\x7fELF"
        # before the switch the cu130 folder, after it the default folder (13.0 itself)
        got = [r.path for r in host.requests if r.path.endswith(".whl")]
        assert any(before in p and ".cu130-" in p for p in got)
        assert any(after in p and ".cu130-" not in p and ".cu129-" not in p for p in got)
        with pytest.raises(ArtifactUnavailable, match="cu129"):
            provider.get(missing)
        with pytest.raises(ArtifactUnavailable, match="not on main") as off_main:
            provider.get(tail)
    assert "#16217" in str(off_main.value)
    # with a source build after the index, both are built instead
    with demo_host(history, tmp_path / "wheels2") as host, \
            _provider(history, host.url, tmp_path / "cache2",
                      ("wheel-index", "source-build")) as provider:
        for commit in (missing, tail):
            assert Path(provider.get(commit).files[SWAP_PATH]).is_file()

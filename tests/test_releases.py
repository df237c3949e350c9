"""The release range: listing a package's releases on a simple index (online, from the saved
listing, from the artifact cache), and resolving --good/--bad versions into candidates."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from packaging.version import Version
from wheelindex import PACKAGE, RELEASES, DemoIndex, IndexEntry

from bisect_tool.artifacts import make_provider
from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.artifacts.download import Downloader, RetryPolicy
from bisect_tool.artifacts.index import IndexFile
from bisect_tool.artifacts.releases import (
    LISTING_RETRY,
    ReleaseListing,
    ReleaseRange,
    group_files,
    list_releases,
    listing_path,
    parse_release_ref,
    release_id,
    resolve_release_range,
)
from bisect_tool.demo.pinned import SWAP_PATH
from bisect_tool.errors import RangeError
from bisect_tool.recipes.recipe import ArtifactSettings
from bisect_tool.values import Direction

URL = "https://index.example/simple"


class Sleeps(list[float]):
    """Records the waits a retry policy asked for, without waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def file(name: str, yanked: str | None = None) -> IndexFile:
    return IndexFile(name, f"https://index.example/files/{name}", "", yanked)


def wheel(package: str, version: str, yanked: str | None = None, build: str = "") -> IndexFile:
    tag = "cp38-abi3-manylinux1_x86_64"
    return file(f"{package}-{version}{'-' + build if build else ''}-{tag}.whl", yanked)


def listing(*versions: str, yanked: dict[str, str] | None = None) -> ReleaseListing:
    yanked = yanked or {}
    files = [wheel("vllm", v, yanked.get(v)) for v in versions]
    return ReleaseListing("vllm", URL, group_files("vllm", files), "index", 0.0)


def ids(found: ReleaseRange) -> list[str]:
    return [c.sha for c in found.range.candidates]


# ---- ids and refs --------------------------------------------------------------------------


def test_release_id_is_a_safe_unique_name_per_version():
    assert release_id("vllm", Version("0.26.0")) == "vllm-0.26.0"
    assert release_id("Flash_Attn", "0.26.0-rc1") == "flash-attn-0.26.0rc1"  # both normalised
    assert release_id("vllm", "0.26") != release_id("vllm", "0.26.1")
    local = release_id("vllm", "0.26.0+cu130.abi3")
    assert local == "vllm-0.26.0_cu130.abi3"
    # Safe as a file name and inside a Docker container name.
    for rid in ("vllm-0.26.0", local, release_id("vllm", "1!2.0")):
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", rid), rid


@pytest.mark.parametrize("ref", ["0.26.0", "v0.26.0", " v0.26.0 ", "0.26"])
def test_a_release_ref_is_a_version_with_or_without_v(ref):
    assert parse_release_ref(ref) == Version("0.26.0")


@pytest.mark.parametrize("ref", ["", "main", "release-0.26", "0.26.0.x", "v"])
def test_anything_else_is_a_one_line_range_error_naming_what_is_accepted(ref):
    with pytest.raises(RangeError) as err:
        parse_release_ref(ref)
    message = str(err.value)
    assert f"'{ref}'" in message and "0.26.0" in message and "v0.26.0" in message
    assert "\n" not in message


# ---- grouping files into releases -------------------------------------------------------------


def test_releases_are_in_pep440_order_and_grouped_by_version():
    files = [
        wheel("vllm", "0.10.0"),
        wheel("vllm", "0.9.0"),
        file("vllm-0.23.0.tar.gz"),
        wheel("vllm", "0.23.0", build="2"),  # a rebuild: same release
        wheel("vllm", "0.23.0rc1"),
        file("vllm-0.24.0.dev3.tar.gz"),
        wheel("vllm_flash_attn", "0.23.0"),  # another project
        file("vllm-latest.whl"),  # no version: skipped
        file("README.txt"),
    ]
    releases = group_files("vLLM", files)
    assert [str(r.version) for r in releases] == [
        "0.9.0",
        "0.10.0",
        "0.23.0rc1",
        "0.23.0",
        "0.24.0.dev3",
    ]
    assert [f.filename for f in releases[3].files] == [
        "vllm-0.23.0.tar.gz",
        "vllm-0.23.0-2-cp38-abi3-manylinux1_x86_64.whl",
    ]
    assert [r.is_prerelease for r in releases] == [False, False, True, False, True]
    # An sdist alone gives nothing the pinned stack can load; a manylinux wheel does.
    assert releases[3].loadable and not releases[4].loadable


def test_a_release_is_yanked_only_when_all_its_files_are():
    releases = group_files(
        "vllm",
        [
            wheel("vllm", "1.0", yanked="bad"),
            file("vllm-1.0.tar.gz"),  # still available: 1.0 is not yanked
            wheel("vllm", "1.1", yanked=""),
            file("vllm-1.1.tar.gz", yanked="broken build"),
            wheel("vllm", "1.2", yanked=""),
        ],
    )
    assert [r.yanked for r in releases] == [None, "broken build", ""]


# ---- resolving the range ---------------------------------------------------------------------


def demo_listing() -> ReleaseListing:
    files = [
        IndexFile(r.filename, f"https://index.example/files/{r.filename}", "", r.yanked)
        for r in RELEASES
    ]
    return ReleaseListing(PACKAGE, URL, group_files(PACKAGE, files), "index", 0.0)


def test_fix_direction_lists_releases_old_end_first_leaving_out_pre_and_yanked():
    found = resolve_release_range(demo_listing(), "v0.27.0", "0.24.0")
    r = found.range
    assert r.direction is Direction.FIX
    assert (r.good_ref, r.bad_ref, r.good, r.bad) == (
        "v0.27.0",
        "0.24.0",
        "demollm-0.27.0",
        "demollm-0.24.0",
    )
    assert ids(found) == [
        "demollm-0.24.0",
        "demollm-0.25.0",
        "demollm-0.25.1",
        "demollm-0.26.0",
        "demollm-0.27.0",
    ]
    assert found.left_out == (("0.26.1", "yanked: broken build"), ("0.27.0rc1", "pre-release"))
    assert r.paths == ()
    c = r.candidates[3]
    assert (c.subject, c.pr, c.tags) == ("demollm 0.26.0", None, ("v0.26.0",))
    assert found.release("demollm-0.26.0").version == Version("0.26.0")


def test_regression_direction_and_asking_for_pre_and_yanked():
    found = resolve_release_range(
        demo_listing(), "0.25.1", "0.28.0", pre=True, yanked=True, tag_format="release-{version}"
    )
    assert found.range.direction is Direction.REGRESSION
    assert (found.range.good, found.range.bad) == ("demollm-0.25.1", "demollm-0.28.0")
    assert ids(found) == [
        "demollm-0.25.1",
        "demollm-0.26.0",
        "demollm-0.26.1",
        "demollm-0.27.0rc1",
        "demollm-0.27.0",
        "demollm-0.28.0",
    ]
    assert found.left_out == ()
    assert found.range.candidates[2].subject == "demollm 0.26.1 (yanked: broken build)"
    assert found.range.candidates[3].tags == ("release-0.27.0rc1",)


def test_the_ends_stay_even_when_pre_release_or_yanked():
    found = resolve_release_range(demo_listing(), "0.27.0rc1", "0.26.1")
    assert ids(found) == ["demollm-0.26.1", "demollm-0.27.0rc1"]
    assert found.range.old_end.subject == "demollm 0.26.1 (yanked: broken build)"
    assert found.left_out == ()


def test_releases_without_a_loadable_wheel_stay_candidates_and_are_not_left_out():
    files = [wheel("vllm", "0.22.0"), file("vllm-0.22.1.tar.gz"), wheel("vllm", "0.23.0")]
    found = resolve_release_range(
        ReleaseListing("vllm", URL, group_files("vllm", files), "index", 0.0), "0.23", "0.22"
    )
    assert ids(found) == ["vllm-0.22.0", "vllm-0.22.1", "vllm-0.23.0"]
    assert not found.release("vllm-0.22.1").loadable and found.left_out == ()


def test_an_unknown_end_names_the_nearest_releases():
    versions = listing("0.21.0", "0.22.0", "0.23.0rc1", "0.23.0", "0.24.0")
    with pytest.raises(RangeError) as err:
        resolve_release_range(versions, "0.24.0", "0.22.5")
    assert str(err.value) == f"'0.22.5' is not a release of vllm on {URL}; nearest: 0.22.0, 0.23.0"
    with pytest.raises(RangeError, match="nearest: 0.24.0$"):
        resolve_release_range(versions, "v0.99", "0.22.0")
    with pytest.raises(RangeError, match="'main' is not a release version"):
        resolve_release_range(versions, "main", "0.22.0")


def test_the_same_release_twice_is_refused():
    with pytest.raises(RangeError, match="same release 0.22.0"):
        resolve_release_range(listing("0.22.0", "0.23.0"), "0.22", "v0.22.0")


# ---- listing the index -----------------------------------------------------------------------


def downloader(client: httpx.Client, sleeps: Sleeps, attempts: int = 6) -> Downloader:
    # The wheel downloads' patient policy (6 attempts by default); the listing must not use it.
    return Downloader(client, RetryPolicy(attempts=attempts, sleep=sleeps))


def test_listing_online_saves_the_listing_beside_the_artifact_cache(demollm_index, tmp_path):
    cache = ArtifactCache(tmp_path / "cache").root
    with httpx.Client() as client:
        found = list_releases(
            "DemoLLM", demollm_index.index_url + "/", downloader(client, Sleeps()), cache
        )
    assert found.source == "index" and found.index_url == demollm_index.index_url
    assert [str(r.version) for r in found.releases] == [r.version for r in RELEASES]
    assert found.find(Version("0.26.1")).yanked == "broken build"  # type: ignore[union-attr]
    assert all(r.loadable for r in found.releases)
    saved = json.loads(listing_path(cache, "DemoLLM").read_text())
    assert listing_path(cache, "DemoLLM") == cache / "index" / "demollm.json"
    assert saved["index_url"] == demollm_index.index_url
    assert saved["fetched_at"] == found.fetched_at > 0
    assert len(saved["files"]) == len(RELEASES)
    assert not list((cache / "index").glob("*.tmp"))


def test_offline_the_saved_listing_is_used_after_two_quick_attempts(demollm_index, tmp_path):
    cache = tmp_path / "cache"
    sleeps = Sleeps()
    with httpx.Client() as client:
        online = list_releases(PACKAGE, demollm_index.index_url, downloader(client, sleeps), cache)
        demollm_index.stop()
        quick = downloader(client, sleeps)
        offline = list_releases(PACKAGE, demollm_index.index_url, quick, cache)
        # A caller asking for fewer attempts than the listing's gets fewer.
        once = downloader(client, Sleeps(), attempts=1)
        assert list_releases(PACKAGE, demollm_index.index_url, once, cache).source == "cache"
        assert once.requests == 1
    assert offline.source == "cache" and "gave up" in offline.offline_reason
    assert offline.releases == online.releases
    assert offline.fetched_at == online.fetched_at
    # No stall: the listing's own short policy, not the downloader's six attempts.
    assert quick.requests == LISTING_RETRY.attempts == 2
    assert sleeps == [LISTING_RETRY.wait_initial_s]
    resolved = resolve_release_range(offline, "0.27.0", "0.26.0")
    assert ids(resolved) == ["demollm-0.26.0", "demollm-0.27.0"]


def test_an_index_that_trickles_falls_back_at_the_deadline_not_hours_later(
    demollm_index, tmp_path, monkeypatch
):
    """Issue 38: a page sent a byte at a time answers every read in time; only an overall
    deadline per request stops it (each attempt's, then the saved listing is used)."""
    import threading
    import time

    import bisect_tool.artifacts.releases as releases_module
    from bisect_tool.artifacts.testing import LoopbackHTTP

    cache = tmp_path / "cache"
    stopping = threading.Event()

    def trickle(handler) -> None:  # type: ignore[no-untyped-def]
        handler.send_response(200)
        handler.send_header("Content-Type", "text/html")
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        for _ in range(100000):
            if stopping.wait(0.2):
                return
            try:
                handler.wfile.write(b"<")
                handler.wfile.flush()
            except OSError:
                return

    monkeypatch.setattr(releases_module, "LISTING_DEADLINE_S", 1.0)
    slow = LoopbackHTTP(trickle)
    slow.start()
    try:
        with httpx.Client(timeout=5.0) as client:
            online = list_releases(PACKAGE, demollm_index.index_url, downloader(client, Sleeps()),
                                   cache)
            start = time.monotonic()
            found = list_releases(PACKAGE, slow.url + "/simple", downloader(client, Sleeps()),
                                  cache)
            took = time.monotonic() - start
    finally:
        stopping.set()
        slow.stop()
    assert found.source == "cache" and "deadline of 1 s" in found.offline_reason
    assert found.releases == online.releases
    assert took < 8  # two attempts of one second each, not 100000 bytes at 5 a second


def test_offline_without_a_listing_the_artifact_cache_is_the_listing(demollm_wheels, tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    for version in ("0.27.0", "0.26.0"):
        wheel_path = demollm_wheels.wheels[version]
        cache.import_paths(release_id(PACKAGE, version), [wheel_path], [SWAP_PATH])
    # Neither is a demollm release: a commit and another project sharing the prefix.
    cache.import_paths("c" * 40, [demollm_wheels.wheels["0.24.0"]], [SWAP_PATH])
    cache.import_paths("demollm-extras-1.0", [demollm_wheels.wheels["0.24.0"]], [SWAP_PATH])
    # Release 1 of a project "demollm-2": "2-1" parses as 2.post1, whose id is not this one.
    cache.import_paths("demollm-2-1", [demollm_wheels.wheels["0.24.0"]], [SWAP_PATH])
    with DemoIndex([]) as index:
        pass  # started and stopped: nothing listens on its port any more
    with httpx.Client() as client:
        found = list_releases(PACKAGE, index.index_url, downloader(client, Sleeps()), cache.root)
    assert found.source == "artifact-cache"
    assert [str(r.version) for r in found.releases] == ["0.26.0", "0.27.0"]
    assert all(r.files == () and r.yanked is None for r in found.releases)
    with pytest.raises(RangeError) as err:
        resolve_release_range(found, "0.27.0", "0.24.0")
    assert "in the artifact cache" in str(err.value) and "nearest: 0.26.0" in str(err.value)


def test_offline_with_nothing_cached_says_what_to_do(tmp_path):
    with DemoIndex([]) as index:
        pass
    with httpx.Client() as client, pytest.raises(RangeError) as err:
        list_releases(PACKAGE, index.index_url, downloader(client, Sleeps()), tmp_path / "c")
    assert str(err.value) == (
        f"cannot reach {index.index_url} and no cached listing of {PACKAGE}: run once online, "
        "or `bisect artifacts import --release VERSION ...`"
    )


def test_an_unknown_project_is_an_error_not_offline_even_with_a_saved_listing(
    demollm_index, tmp_path
):
    cache = tmp_path / "cache"
    listing_path(cache, "vllm").parent.mkdir(parents=True)
    listing_path(cache, "vllm").write_text(
        json.dumps({"index_url": URL, "fetched_at": 1.0, "files": [wheel("vllm", "1.0").to_json()]})
    )
    with httpx.Client() as client, pytest.raises(RangeError) as err:
        list_releases("vllm", demollm_index.index_url, downloader(client, Sleeps()), cache)
    message = str(err.value)
    assert "404" in message and demollm_index.index_url in message
    assert "has no project 'vllm'" in message and "[artifacts] package" in message
    assert demollm_index.gets["/simple/vllm/"] == 1


def test_an_index_url_that_is_not_http_is_refused_before_any_request(tmp_path):
    with httpx.Client() as client, pytest.raises(RangeError, match="not an http"):
        list_releases("vllm", "pypi.org/simple", downloader(client, Sleeps()), tmp_path)


def test_a_later_online_listing_replaces_the_saved_one(demollm_index, tmp_path):
    cache = tmp_path / "cache"
    with httpx.Client() as client:
        list_releases(PACKAGE, demollm_index.index_url, downloader(client, Sleeps()), cache)
        demollm_index.add(IndexEntry(f"{PACKAGE}-0.29.0.tar.gz", b"sdist"))
        list_releases(PACKAGE, demollm_index.index_url, downloader(client, Sleeps()), cache)
        demollm_index.stop()
        offline = list_releases(
            PACKAGE, demollm_index.index_url, downloader(client, Sleeps()), cache
        )
    assert offline.source == "cache" and str(offline.releases[-1].version) == "0.29.0"
    assert not offline.releases[-1].loadable


# ---- end to end: the release source fetches a listed release from the real index -------------


def test_release_source_fetches_a_listed_release_into_the_cache(
    demollm_index, demollm_wheels, tmp_path, monkeypatch
):
    monkeypatch.setenv("PIP_INDEX_URL", demollm_index.index_url)
    settings = ArtifactSettings(
        sources=("release",),
        swap_set=(SWAP_PATH,),
        package=PACKAGE,
        cache_dir=str(tmp_path / "cache"),
    )
    quick = RetryPolicy(attempts=2, wait_initial_s=0.01)
    with make_provider(settings, tmp_path, retry=quick) as provider:
        assert provider.downloader is not None
        listed = list_releases(
            PACKAGE, demollm_index.index_url, provider.downloader, provider.cache.root
        )
        found = resolve_release_range(listed, "0.27.0", "0.26.0")
        old = found.range.old_end
        swap = provider.get(old.sha, old.tags)
    assert old.sha == "demollm-0.26.0"
    assert swap.source == "release" and swap.origin.endswith(RELEASES[3].filename)
    assert swap.files[SWAP_PATH].read_bytes() == demollm_wheels.kernel_bytes("0.26.0")
    assert (tmp_path / "cache" / "manifests" / "demollm-0.26.0.json").is_file()
    assert demollm_index.gets[f"/files/{RELEASES[3].filename}"] == 1
    # Offline later, with the saved listing gone, the fetched release is still known.
    demollm_index.stop()
    listing_path(tmp_path / "cache", PACKAGE).unlink()
    with httpx.Client() as client:
        offline = list_releases(
            PACKAGE, demollm_index.index_url, downloader(client, Sleeps()), tmp_path / "cache"
        )
    assert offline.source == "artifact-cache"
    assert [r.version for r in offline.releases] == [Version("0.26.0")]

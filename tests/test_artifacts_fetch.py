"""Fetching swap sets over a real HTTP wheel index on loopback, with faults at the server."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bisect_tool.artifacts import make_provider
from bisect_tool.artifacts.download import RetryPolicy
from bisect_tool.artifacts.pipindex import pip_index_url
from bisect_tool.artifacts.provider import CachingProvider
from bisect_tool.artifacts.release_source import release_version
from bisect_tool.artifacts.sources import LEGACY_WHEEL, wheel_rank
from bisect_tool.artifacts.testing import Fault, WheelServer, make_wheel
from bisect_tool.errors import ArtifactUnavailable
from bisect_tool.recipes.recipe import ArtifactSettings

MEMBER = "vllm/_C_stable_libtorch.abi3.so"
COMMIT = "a" * 40
OTHER = "b" * 40


def so_bytes(tag: str, size: int = 300_000) -> bytes:
    # Incompressible and distinct per commit, so a mix-up between commits shows.
    return random.Random(tag).randbytes(size)


def wheel_bytes(tmp_path: Path, tag: str, **kw: object) -> bytes:
    path = make_wheel(
        tmp_path / f"{tag}.whl",
        {MEMBER: so_bytes(tag), "vllm/__init__.py": b"# python side\n"},
        **kw,  # type: ignore[arg-type]
    )
    return path.read_bytes()


class Sleeps(list[float]):
    """Records the waits the retry policy asked for, without waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def server() -> Iterator[WheelServer]:
    with WheelServer() as srv:
        yield srv


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def settings_for(server: WheelServer, tmp_path: Path, **kw: object) -> ArtifactSettings:
    values: dict[str, object] = {
        "sources": ("wheel-index",),
        "swap_set": (MEMBER,),
        "wheel_index_url": server.url,
        "cache_dir": str(tmp_path / "cache"),
    }
    values.update(kw)
    return ArtifactSettings(**values)  # type: ignore[arg-type]


def provider(server: WheelServer, tmp_path: Path, sleeps: Sleeps, **kw: object) -> CachingProvider:
    policy = RetryPolicy(attempts=4, wait_initial_s=0.01, retry_after_cap_s=5.0, sleep=sleeps)
    return make_provider(settings_for(server, tmp_path, **kw), tmp_path, retry=policy)


def test_wheel_index_serves_the_member_of_that_commit(server, tmp_path, sleeps):
    server.add_commit_wheel(COMMIT, wheel_bytes(tmp_path, "a"))
    with provider(server, tmp_path, sleeps) as p:
        swap = p.get(COMMIT)
    assert swap.files[MEMBER].read_bytes() == so_bytes("a")
    assert swap.sha256[MEMBER] == hashlib.sha256(so_bytes("a")).hexdigest()
    assert swap.source == "wheel-index"
    assert "%2B" in swap.origin  # the metadata's quoted path was used as given
    # Only the swap-set blob is kept: the downloaded wheel is gone.
    assert not list((tmp_path / "cache" / "downloads").iterdir())


def test_variant_folder_and_legacy_name(server, tmp_path, sleeps):
    server.add_commit_wheel(COMMIT, wheel_bytes(tmp_path, "v"), variant="cu130")
    server.add(f"/{OTHER}/{LEGACY_WHEEL}", wheel_bytes(tmp_path, "legacy"))
    with provider(server, tmp_path, sleeps, variant="cu130") as p:
        assert p.get(COMMIT).files[MEMBER].read_bytes() == so_bytes("v")
    with provider(server, tmp_path, sleeps) as p:
        assert p.get(OTHER).files[MEMBER].read_bytes() == so_bytes("legacy")


def test_dropped_connection_resumes_with_range(server, tmp_path, sleeps):
    url = server.add_commit_wheel(COMMIT, wheel_bytes(tmp_path, "a"))
    wheel_path = "/" + url.split("/", 3)[3]
    # the third request is the member's (after the end records and the central directory)
    server.fail(wheel_path, Fault("pass"), Fault("pass"), Fault("drop"))
    with provider(server, tmp_path, sleeps) as p:
        swap = p.get(COMMIT)
    assert swap.files[MEMBER].read_bytes() == so_bytes("a")
    asked = [r for _, r in server.ranges]
    assert len(asked) == 4 and asked[0] == "bytes=-42"
    member, resumed = asked[2], asked[3]
    first, last = map(int, member.removeprefix("bytes=").split("-"))
    again, last_again = map(int, resumed.removeprefix("bytes=").split("-"))
    # resumed past what arrived, to the same end: nothing fetched twice
    assert first == 0 and first < again < last and last_again == last


def test_503_then_200_and_429_honours_retry_after(server, tmp_path, sleeps):
    url = server.add_commit_wheel(COMMIT, wheel_bytes(tmp_path, "a"))
    wheel_path = "/" + url.split("/", 3)[3]
    server.fail(f"/{COMMIT}/vllm/metadata.json", Fault("status", 503))
    server.fail(wheel_path, Fault("status", 429, retry_after="3"), Fault("status", 429, "999"))
    with provider(server, tmp_path, sleeps) as p:
        assert p.get(COMMIT).files[MEMBER].read_bytes() == so_bytes("a")
    assert 3.0 in sleeps  # Retry-After honoured
    assert 5.0 in sleeps and 999.0 not in sleeps  # ... up to the cap


def test_404_is_not_retried_and_reasons_are_listed(server, tmp_path, sleeps):
    with provider(server, tmp_path, sleeps) as p, pytest.raises(ArtifactUnavailable) as err:
        p.get(COMMIT)
    assert server.gets[f"/{COMMIT}/vllm/metadata.json"] == 1
    assert server.gets[f"/{COMMIT}/{LEGACY_WHEEL}"] == 1
    assert sleeps == []
    assert "wheel-index: no wheel at" in str(err.value) and "404" in str(err.value)
    assert "\n" not in str(err.value)


def test_persistent_503_gives_up_after_the_attempts(server, tmp_path, sleeps):
    meta = f"/{COMMIT}/vllm/metadata.json"
    server.fail(meta, *[Fault("status", 503)] * 10)
    with provider(server, tmp_path, sleeps) as p, pytest.raises(ArtifactUnavailable) as err:
        p.get(COMMIT)
    assert server.gets[meta] == 4
    assert "gave up after 4 attempts" in str(err.value)


@pytest.mark.parametrize("damage", ["truncated", "not-a-zip"])
def test_damaged_wheel_is_unavailable_in_one_line(server, tmp_path, sleeps, damage):
    good = wheel_bytes(tmp_path, "a")
    data = good[: len(good) * 2 // 3] if damage == "truncated" else b"<html>oops</html>" * 100
    server.add_commit_wheel(COMMIT, data)
    with provider(server, tmp_path, sleeps) as p, pytest.raises(ArtifactUnavailable) as err:
        p.get(COMMIT)
    assert "not a readable wheel" in str(err.value)
    assert not list((tmp_path / "cache" / "manifests").iterdir())
    assert not list((tmp_path / "cache" / "downloads").iterdir())  # deleted: refetched clean


def test_release_wrong_sha256_is_rejected_and_nothing_cached(server, tmp_path, sleeps, monkeypatch):
    data = wheel_bytes(tmp_path, "rel")
    server.add_release("vllm", "vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl", data, sha256="0" * 64)
    monkeypatch.setenv("PIP_INDEX_URL", server.url + "/simple")
    with (
        provider(server, tmp_path, sleeps, sources=("release",)) as p,
        pytest.raises(ArtifactUnavailable) as err,
    ):
        p.get(COMMIT, tags=("v0.26.0",))
    assert "sha256 mismatch" in str(err.value)
    assert not list((tmp_path / "cache" / "manifests").iterdir())
    assert not list((tmp_path / "cache" / "downloads").iterdir())


@pytest.mark.parametrize("html", [False, True])
def test_release_wheel_from_simple_index(server, tmp_path, sleeps, monkeypatch, html):
    good = wheel_bytes(tmp_path, "rel")
    server.add_release("vllm", "vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl", good, html=html)
    server.add_release("vllm", "vllm-0.26.0-cp38-abi3-manylinux2014_aarch64.whl", b"arm")
    monkeypatch.setenv("PIP_INDEX_URL", server.url + "/simple")
    with provider(server, tmp_path, sleeps, sources=("release",)) as p:
        with pytest.raises(ArtifactUnavailable, match="no release tag"):
            p.get(OTHER, tags=("nightly",))
        swap = p.get(COMMIT, tags=("v0.26.0",))
    assert swap.source == "release" and swap.files[MEMBER].read_bytes() == so_bytes("rel")


def test_release_picks_the_wheel_the_pinned_stack_loads_by_pep440_version(
    server, tmp_path, sleeps, monkeypatch
):
    good = wheel_bytes(tmp_path, "final")
    # Each of these would fail to extract (not a zip): picking one shows as an error.
    server.add_release("vllm", "vllm-0.26.0-cp311-cp311-manylinux1_x86_64.whl", b"py3.11")
    server.add_release("vllm", "vllm-0.26.0-cp38-abi3-manylinux_2_39_x86_64.whl", b"new glibc")
    server.add_release("vllm", "vllm-0.26.0-cp38-abi3-manylinux2014_aarch64.whl", b"arm")
    server.add_release("vllm", "vllm-0.26.0rc1-cp38-abi3-manylinux1_x86_64.whl", b"rc1")
    server.add_release("vllm", "vllm_other-0.26.0-cp38-abi3-manylinux1_x86_64.whl", b"other")
    server.add_release("vllm", "vllm-0.26.0.tar.gz", b"sdist")
    server.add_release("vllm", "vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl", good)
    monkeypatch.setenv("PIP_INDEX_URL", server.url + "/simple")
    with provider(server, tmp_path, sleeps, sources=("release",)) as p:
        # Both tags on one commit: the final release is tried first, and the tag "v0.26"
        # names the same PEP 440 version as the wheel's "0.26.0".
        swap = p.get(COMMIT, tags=("v0.26.0rc1", "v0.26", "nightly"))
        assert swap.files[MEMBER].read_bytes() == so_bytes("final")
        with pytest.raises(ArtifactUnavailable, match=r"no wheel for CPython 3\.12.*vllm==0\.25"):
            p.get(OTHER, tags=("v0.25.0",))


def test_wheel_choice_follows_pips_tag_order_for_the_pinned_stack():
    names = [
        "vllm-0.26.0-py3-none-any.whl",
        "vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl",
        "vllm-0.26.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "vllm-0.26.0-cp38-abi3-linux_x86_64.whl",
    ]
    loadable = sorted(names, key=lambda n: wheel_rank(n))  # type: ignore[arg-type,return-value]
    assert loadable == [names[2], names[1], names[3], names[0]]
    for other in (
        "vllm-0.26.0-cp38-abi3-manylinux2014_aarch64.whl",
        "vllm-0.26.0-cp313-cp313-manylinux1_x86_64.whl",
        "vllm-0.26.0-cp38-abi3-manylinux_2_39_x86_64.whl",  # newer glibc than the image's
        "vllm-0.26.0-cp38-abi3-macosx_11_0_arm64.whl",
        "vllm-0.26.0.tar.gz",
        "not a wheel.whl",
    ):
        assert wheel_rank(other) is None, other
    # vLLM's per-commit names carry a local version; the legacy fixed name too is loadable.
    assert wheel_rank("vllm-0.11.0rc2.dev55+g1234abc.cu129-cp38-abi3-manylinux1_x86_64.whl")
    assert wheel_rank(LEGACY_WHEEL) is not None
    assert [str(release_version(t)) for t in ("v0.26.0", "0.9.0.post1", "v0.11.0rc2")] == [
        "0.26.0", "0.9.0.post1", "0.11.0rc2"
    ]
    assert [release_version(t) for t in ("nightly", "v0.26.0.dev1", "v0.26.0+cu129")] == [
        None, None, None
    ]


def test_pip_index_url_reads_env_then_config(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nindex-url = http://127.0.0.1:1/g\n[install]\nindex-url = http://127.0.0.1:1/i\n"
    )
    assert pip_index_url({"PIP_CONFIG_FILE": str(conf)}, home=tmp_path) == "http://127.0.0.1:1/i"
    env = {"PIP_CONFIG_FILE": str(conf), "PIP_INDEX_URL": "http://127.0.0.1:1/env"}
    assert pip_index_url(env, home=tmp_path) == "http://127.0.0.1:1/env"
    user = tmp_path / ".config" / "pip" / "pip.conf"
    user.parent.mkdir(parents=True)
    user.write_text("[global]\nindex-url = http://127.0.0.1:1/user\n")
    assert pip_index_url({}, home=tmp_path) in ("http://127.0.0.1:1/user",)


def test_two_providers_fetch_one_commit_once(server, tmp_path, sleeps):
    url = server.add_commit_wheel(COMMIT, wheel_bytes(tmp_path, "a"))
    wheel_path = unquote_path(url)
    results: list[bytes] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def run() -> None:
        try:
            with provider(server, tmp_path, sleeps) as p:
                start.wait(timeout=10)
                results.append(p.get(COMMIT).files[MEMBER].read_bytes())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert results == [so_bytes("a")] * 2
    # one fetch: the end records, the central directory, the member
    assert server.gets[wheel_path] == 3


def test_second_run_downloads_nothing(server, tmp_path, sleeps):
    server.add_commit_wheel(COMMIT, wheel_bytes(tmp_path, "a"))
    server.add_commit_wheel(OTHER, wheel_bytes(tmp_path, "b"))
    with provider(server, tmp_path, sleeps) as p:
        first = {c: p.get(c).files[MEMBER] for c in (COMMIT, OTHER)}
        assert p.bytes_downloaded > 0
    sent, gets = server.bytes_sent, sum(server.gets.values())
    with provider(server, tmp_path, sleeps) as p:
        again = {c: p.get(c).files[MEMBER] for c in (COMMIT, OTHER)}
        assert p.bytes_downloaded == 0
    assert again == first
    assert (server.bytes_sent, sum(server.gets.values())) == (sent, gets)


def test_prefetch_fetches_in_background_and_keeps_errors_per_commit(server, tmp_path, sleeps):
    server.add_commit_wheel(COMMIT, wheel_bytes(tmp_path, "a"))
    with provider(server, tmp_path, sleeps) as p:
        p.prefetch([COMMIT, OTHER], {})  # OTHER does not exist: must not disturb COMMIT
        assert p.get(COMMIT).files[MEMBER].read_bytes() == so_bytes("a")
        with pytest.raises(ArtifactUnavailable, match="no wheel at .*404"):
            p.get(OTHER)
    assert server.gets[f"/{COMMIT}/vllm/metadata.json"] == 1


def test_local_paths_wheel_and_folder_and_cache_first(server, tmp_path, sleeps):
    wheel = make_wheel(tmp_path / "local.whl", {MEMBER: so_bytes("local")})
    folder = tmp_path / "built" / "vllm"
    folder.mkdir(parents=True)
    (folder / "_C_stable_libtorch.abi3.so").write_bytes(so_bytes("dir"))
    local = {"v0.26.0": str(wheel), OTHER[:10]: str(tmp_path / "built")}
    with provider(
        server, tmp_path, sleeps, sources=("wheel-index", "local"), local_paths=local
    ) as p:
        assert p.get(COMMIT, tags=("v0.26.0",)).files[MEMBER].read_bytes() == so_bytes("local")
        assert p.get(OTHER).files[MEMBER].read_bytes() == so_bytes("dir")
    requests = sum(server.gets.values())
    os.remove(wheel)  # served from the cache now, before any source
    with provider(
        server, tmp_path, sleeps, sources=("wheel-index", "local"), local_paths=local
    ) as p:
        assert p.get(COMMIT).source == "local"
    assert sum(server.gets.values()) == requests


def unquote_path(url: str) -> str:
    from urllib.parse import unquote

    return unquote("/" + url.split("/", 3)[3])

"""vLLM's per-commit wheels as vLLM publishes them (issue 37, items 2 and 3): the loopback index
(``bisect_tool.artifacts.wheelhost``) serves the documented layout, the wheel-index source picks
the CUDA variant the pinned torch loads and says why a commit has no wheel, and only the
swap-set members travel, by HTTP range. Real wheels, real HTTP on 127.0.0.1, the exact requests
asserted.

Facts used (vllm-facts.md, "Where per-commit builds come from", "How releases sit in the
history"; vLLM's generate-nightly-index.py): metadata.json per commit and variant folder, its
entries' fields, ``path`` relative and quoted (``+`` as ``%2B``), the default's alias folder,
the legacy fixed name, the manylinux_2_28 / cp38-abi3 tags, the default's switch from cu129 to
cu130 (vLLM PR #39878), no wheels off main (vLLM #16217) nor for an hour after a merge.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bisect_tool.artifacts import make_provider
from bisect_tool.artifacts.cuda import DEFAULT_SWITCH, PinnedCuda, ask_pinned_cuda
from bisect_tool.artifacts.download import Downloader, GaveUp, RetryPolicy
from bisect_tool.artifacts.members import fetch_members, read_directory
from bisect_tool.artifacts.origins import locate_all
from bisect_tool.artifacts.sources import CommitFacts
from bisect_tool.artifacts.testing import byte_range, make_wheel
from bisect_tool.artifacts.wheelhost import LEGACY_WHEEL, HostedCommit, WheelHost
from bisect_tool.errors import ArtifactUnavailable
from bisect_tool.recipes.recipe import ArtifactSettings, RuntimeSettings
from bisect_tool.run.plan import CandidateLine, availability, render_availability

MEMBER = "vllm/_C_stable_libtorch.abi3.so"
A, B, C, D, E = (ch * 40 for ch in "abcde")
CUDA13 = PinnedCuda("13.0", "torch.version.cuda of the test")
CUDA12 = PinnedCuda("12.8", "torch.version.cuda of the test")
BEFORE_SWITCH = DEFAULT_SWITCH - 30 * 86400
AFTER_SWITCH = DEFAULT_SWITCH + 30 * 86400


def so_bytes(tag: str, size: int = 200_000) -> bytes:
    return random.Random(tag).randbytes(size)


class Builds:
    """The host's ``build(commit, variant)``: a real wheel whose member says which build it
    is (its bytes are ``so_bytes(commit + variant)``), among other members."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[tuple[str, str]] = []

    def __call__(self, commit: str, variant: str) -> Path:
        self.calls.append((commit, variant))
        return make_wheel(
            self.root / f"{commit[:8]}-{variant or 'legacy'}.whl",
            {
                "vllm/__init__.py": b"# python side\n",
                "vllm/_moe_C.abi3.so": so_bytes("moe" + commit, 300_000),
                MEMBER: so_bytes(commit + variant),
                "vllm/third_party/big.so": so_bytes("big" + commit, 400_000),
            },
        )


@pytest.fixture
def builds(tmp_path: Path) -> Builds:
    (tmp_path / "wheels").mkdir()
    return Builds(tmp_path / "wheels")


@pytest.fixture
def host(builds: Builds) -> Iterator[WheelHost]:
    with WheelHost(builds) as served:
        yield served


def settings(host: WheelHost, tmp_path: Path, **kw: object) -> ArtifactSettings:
    values: dict[str, object] = {
        "sources": ("wheel-index",),
        "swap_set": (MEMBER,),
        "wheel_index_url": host.url,
        "cache_dir": str(tmp_path / "cache"),
    }
    values.update(kw)
    return ArtifactSettings(**values)  # type: ignore[arg-type]


QUICK = RetryPolicy(attempts=3, wait_initial_s=0.01, sleep=lambda s: None)


def provider(host: WheelHost, tmp_path: Path, pinned: PinnedCuda = CUDA13, facts=None,
             progress=None, **kw: object):  # type: ignore[no-untyped-def]
    return make_provider(settings(host, tmp_path, **kw), tmp_path, retry=QUICK,
                         pinned_cuda=pinned, facts=facts, progress=progress)


# --- the host serves the documented layout ---------------------------------------------------


def test_the_host_serves_vllms_layout_metadata_paths_variants_and_legacy(host, builds):
    host.add(HostedCommit(A, default="cu130", variants=("cu130", "cu129", "cpu")),
             HostedCommit(B, legacy=True))
    with httpx.Client() as client:
        default = client.get(f"{host.url}/{A}/vllm/metadata.json").json()
        alias = client.get(f"{host.url}/{A}/cu130/vllm/metadata.json").json()
        cu129 = client.get(f"{host.url}/{A}/cu129/vllm/metadata.json").json()
        listing = client.get(f"{host.url}/{A}/index.html").text
        assert client.get(f"{host.url}/{B}/vllm/metadata.json").status_code == 404
        assert client.get(f"{host.url}/{C}/vllm/metadata.json").status_code == 404
        assert client.head(f"{host.url}/{B}/{LEGACY_WHEEL}").status_code == 200
        x86 = [e for e in default if e["platform_tag"] == "manylinux_2_28_x86_64"][0]
        assert set(x86) == {"package_name", "version", "build_tag", "python_tag", "abi_tag",
                            "platform_tag", "variant", "filename", "path"}
        assert (x86["python_tag"], x86["abi_tag"], x86["variant"]) == ("cp38", "abi3", None)
        assert x86["filename"] == \
            f"vllm-0.27.0.dev5+g{A[:9]}-cp38-abi3-manylinux_2_28_x86_64.whl"
        assert x86["path"] == "../" + x86["filename"].replace("+", "%2B")
        # the alias folder lists the default build, one level deeper
        assert [e["filename"] for e in alias] == [e["filename"] for e in default]
        assert all(e["path"].startswith("../../") for e in alias)
        assert {e["variant"] for e in cu129} == {"cu129"}
        assert all(".cu129-cp38" in e["filename"] for e in cu129)
        assert {"vllm/", "cu129/", "cu130/", "cpu/"} <= set(
            part.split('"')[0] for part in listing.split('href="')[1:])
        assert builds.calls == [(B, "")]  # only the wheel a HEAD asked was built (its length)
        # the quoted path resolves against the metadata's folder, to the default build
        wheel = client.get(str(httpx.URL(f"{host.url}/{A}/cu130/vllm/").join(alias[0]["path"])))
        assert wheel.status_code == 200 and zipfile.is_zipfile(__import__("io").BytesIO(
            wheel.content))
    assert builds.calls == [(B, ""), (A, "cu130")]


def test_the_host_answers_ranges_counts_bytes_and_builds_once(host, builds):
    host.add(HostedCommit(A))
    url = host.wheel_url(A)
    size = builds(A, "cu130").stat().st_size
    builds.calls.clear()
    with httpx.Client() as client:
        tail = client.get(url, headers={"Range": "bytes=-42"})
        head = client.get(url, headers={"Range": "bytes=0-9"})
        rest = client.get(url, headers={"Range": f"bytes={size - 5}-"})
        beyond = client.get(url, headers={"Range": f"bytes={size}-"})
    assert (tail.status_code, tail.headers["content-range"]) == \
        (206, f"bytes {size - 42}-{size - 1}/{size}")
    assert (head.status_code, len(head.content), rest.status_code, len(rest.content)) == \
        (206, 10, 206, 5)
    assert beyond.status_code == 416
    assert builds.calls == [(A, "cu130")]  # built on the first request, once
    assert host.bytes_sent() == 42 + 10 + 5
    host.ignore_ranges = True
    with httpx.Client() as client:
        whole = client.get(url, headers={"Range": "bytes=-42"})
    assert whole.status_code == 200 and len(whole.content) == size
    assert [byte_range(h, 100) for h in ("bytes=-10", "bytes=5-", "bytes=0-0", "bytes=1-2,4-5",
                                          "bytes=100-", "items=0-1")] == \
        [(90, 100), (5, 100), (0, 1), None, "unsatisfiable", None]


def test_the_host_throttles_to_its_bandwidth(host):
    host.add(HostedCommit(A))
    host.rate_bps = 200_000
    with httpx.Client() as client:
        start = time.monotonic()
        got = client.get(host.wheel_url(A), headers={"Range": "bytes=0-99999"})
        took = time.monotonic() - start
    assert len(got.content) == 100_000
    assert took >= 0.4  # 100 kB at 200 kB/s: half a second, less a little for the first chunk


# --- only the members travel ------------------------------------------------------------------


def test_only_the_members_and_the_central_directory_are_fetched(host, builds, tmp_path):
    host.add(HostedCommit(A))
    wheel = builds(A, "cu130")
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(MEMBER)
        start_dir = archive.start_dir
        later = sorted(i.header_offset for i in archive.infolist()
                       if i.header_offset > info.header_offset)
    size = wheel.stat().st_size
    with provider(host, tmp_path) as p:
        swap = p.get(A)
    assert swap.files[MEMBER].read_bytes() == so_bytes(A + "cu130")
    url_path = host.wheel_url(A).split(host.url, 1)[1]
    # exactly: the end records (with the 20 bytes of a ZIP64 locator's place), the central
    # directory less what arrived with them, the member's local record
    assert host.ranges() == [
        "bytes=-42",
        f"bytes={start_dir}-{size - 43}",
        f"bytes={info.header_offset}-{later[0] - 1}",
    ]
    assert host.asked() == [f"/{A}/cu130/vllm/metadata.json", url_path, url_path, url_path]
    local_header = 30 + len(MEMBER.encode()) + len(info.extra)
    moved = host.bytes_sent([url_path])
    assert moved == info.compress_size + local_header + (size - start_dir)
    assert moved < size / 4  # the member is 200 kB of 900: the others stayed on the server
    manifest = json.loads(next((tmp_path / "cache" / "manifests").glob("*.json")).read_text())
    assert manifest["origin"] == host.wheel_url(A)
    assert manifest["files"][MEMBER]["sha256"] == swap.sha256[MEMBER]


def test_a_server_that_ignores_ranges_gets_whole_wheels_said_once(host, builds, tmp_path):
    host.add(HostedCommit(A), HostedCommit(B))
    host.ignore_ranges = True
    said: list[str] = []
    with provider(host, tmp_path, progress=said.append) as p:
        assert p.get(A).files[MEMBER].read_bytes() == so_bytes(A + "cu130")
        assert p.get(B).files[MEMBER].read_bytes() == so_bytes(B + "cu130")
    assert sum("ignores HTTP range requests" in line for line in said) == 1
    # A: the range request answered 200 (dropped unread), then the whole wheel; B: whole only
    wheel_requests = [r for r in host.requests if r.path.endswith(".whl")]
    assert [r.range for r in wheel_requests] == ["bytes=-42", "", ""]
    assert not list((tmp_path / "cache" / "downloads").iterdir())


def test_a_damaged_member_is_refused_by_its_crc_and_nothing_is_cached(tmp_path):
    good = make_wheel(tmp_path / "good.whl", {MEMBER: so_bytes("x"), "vllm/a.py": b"a"})
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as archive:
        info = archive.getinfo(MEMBER)
    at = info.header_offset + 30 + len(MEMBER) + len(info.extra) + 1000
    data[at] ^= 0xFF  # stored? no: deflated random bytes, still one wrong byte in the stream
    bad = tmp_path / "bad.whl"
    bad.write_bytes(bytes(data))
    with WheelHost(lambda c, v: bad) as host:
        host.add(HostedCommit(A))
        with provider(host, tmp_path) as p, pytest.raises(ArtifactUnavailable) as err:
            p.get(A)
    assert "damaged" in str(err.value) or "CRC" in str(err.value)
    assert not list((tmp_path / "cache" / "manifests").iterdir())


def test_read_directory_gives_the_bytes_a_fetch_moves(host, builds):
    host.add(HostedCommit(A))
    with httpx.Client() as client:
        downloader = Downloader(client)
        directory = read_directory(downloader, host.wheel_url(A), [MEMBER])
        before = host.bytes_sent()
        got = fetch_members(downloader, host.wheel_url(A), [MEMBER],
                            Path(builds.root) / "out")
    with zipfile.ZipFile(builds(A, "cu130")) as archive:
        assert directory.members == {MEMBER: archive.getinfo(MEMBER).compress_size}
    assert got.bytes == host.bytes_sent() - before == directory.fetch_bytes
    assert got.requests == 3


# --- the CUDA variant the pinned torch loads --------------------------------------------------


@pytest.mark.parametrize("pinned, folder, build", [(CUDA13, "cu130", "cu130"),
                                                   (CUDA12, "cu129", "cu129")])
def test_the_variant_follows_the_pinned_torch(host, tmp_path, pinned, folder, build):
    host.add(HostedCommit(A, default="cu130", variants=("cu130", "cu129")))
    with provider(host, tmp_path, pinned=pinned) as p:
        swap = p.get(A)
    assert swap.files[MEMBER].read_bytes() == so_bytes(A + build)
    assert host.asked()[0] == f"/{A}/{folder}/vllm/metadata.json"


def test_the_default_folder_serves_only_when_its_cuda_matches(host, tmp_path):
    # an old commit: no variant folders, its default build cu129 (judged by its date)
    host.add(HostedCommit(A, default="cu129", variants=()))
    facts = {A: CommitFacts(on_mainline=True, committed_at=BEFORE_SWITCH)}
    with provider(host, tmp_path, pinned=CUDA12, facts=facts) as p:
        assert p.get(A).files[MEMBER].read_bytes() == so_bytes(A + "cu129")
    assert host.asked()[:2] == [f"/{A}/cu129/vllm/metadata.json", f"/{A}/vllm/metadata.json"]
    before = len(host.requests)
    with provider(host, tmp_path / "b", pinned=CUDA13, facts=facts) as p, \
            pytest.raises(ArtifactUnavailable) as err:
        p.get(A)
    message = str(err.value)
    assert "cu129 wheel; the pinned torch is built for CUDA 13.0" in message
    assert "the commit's date" in message and "#39878" in message
    assert not any(r.path.endswith(".whl") for r in host.requests[before:])  # before a byte


def test_the_default_builds_cuda_is_read_from_its_version_before_the_date(tmp_path, builds):
    # vLLM's generator in default-variant mode: the default folder's wheels carry a suffix
    with WheelHost(builds) as host:
        host.add(HostedCommit(A, default=None, variants=("cu129",)))
        facts = {A: CommitFacts(committed_at=AFTER_SWITCH)}  # the date would say cu130
        from bisect_tool.artifacts.sources import WheelIndexSource

        with httpx.Client() as client:
            source = WheelIndexSource(host.url, "vllm", "", Downloader(client),
                                      tmp_path, pinned=CUDA13)
            entry = {"variant": None, "version": "0.19.0+cu129",
                     "filename": "vllm-0.19.0+cu129-cp38-abi3-manylinux_2_31_x86_64.whl"}
            assert source.default_cuda(entry, facts[A]) == ("cu129", "its version's local part")
            with pytest.raises(ArtifactUnavailable, match="no cu130 build: the commit has cu129"):
                source.locate(A, facts[A])


def test_a_variant_the_recipe_names_that_the_torch_cannot_load_is_refused(host, tmp_path):
    host.add(HostedCommit(A))
    with provider(host, tmp_path, pinned=CUDA13, variant="cu129") as p, \
            pytest.raises(ArtifactUnavailable) as err:
        p.get(A)
    assert "cu129 variant named by the recipe; the pinned torch is built for CUDA 13.0" in \
        str(err.value)
    assert host.requests == []


def test_the_pinned_torch_is_asked_in_the_pinned_interpreter(tmp_path, host):
    # The pinned stack's torch (a module on its pinned package path, as torch lays it out:
    # torch.version.cuda); the tool's own interpreter has none.
    stack = tmp_path / "stack"
    (stack / "torch").mkdir(parents=True)
    (stack / "torch" / "__init__.py").write_text("from torch import version\n")
    (stack / "torch" / "version.py").write_text("cuda = '12.9'\n__version__ = '2.10.0'\n")
    runtime = RuntimeSettings(backend="local", python=sys.executable,
                              pinned_package_dir=str(stack))
    asked = ask_pinned_cuda(runtime)
    assert (asked.version, asked.variant) == ("12.9", "cu129")
    assert asked.how == f"torch.version.cuda of {sys.executable}"
    host.add(HostedCommit(A, default="cu130", variants=("cu130", "cu129")))
    with make_provider(settings(host, tmp_path), tmp_path, retry=QUICK, runtime=runtime) as p:
        assert p.get(A).files[MEMBER].read_bytes() == so_bytes(A + "cu129")
    assert host.asked()[0] == f"/{A}/cu129/vllm/metadata.json"


# --- a commit without a wheel says why ----------------------------------------------------------


def test_a_commit_without_a_wheel_says_why_then_the_next_source_serves(host, tmp_path):
    host.add(HostedCommit(D, default=None, variants=("cpu",)))
    now = time.time()
    facts = {
        A: CommitFacts(on_mainline=False, committed_at=now - 86400),
        B: CommitFacts(on_mainline=True, committed_at=now - 600),
        C: CommitFacts(on_mainline=True, committed_at=now - 86400),
        D: CommitFacts(on_mainline=True, committed_at=now - 86400),
    }
    local = tmp_path / "built"
    (local / "vllm").mkdir(parents=True)
    (local / MEMBER).write_bytes(b"built here")
    why: dict[str, str] = {}
    for commit in (A, B, C, D):
        with provider(host, tmp_path, facts=facts) as p, \
                pytest.raises(ArtifactUnavailable) as err:
            p.get(commit)
        why[commit] = str(err.value)
    assert "not on main: vLLM publishes per-commit wheels for main's commits only " \
        "(vLLM #16217)" in why[A]
    assert "committed 10 min ago" in why[B] and "about an hour" in why[B]
    assert "no wheel at" in why[C] and "404" in why[C]
    assert "no cu130 build: the commit has cpu" in why[D]
    # the next source then serves the commit, and the reason stays in no error
    with provider(host, tmp_path, facts=facts, sources=("wheel-index", "local"),
                  local_paths={A[:10]: str(local)}) as p:
        swap = p.get(A)
    assert swap.source == "local" and swap.files[MEMBER].read_bytes() == b"built here"


def test_a_legacy_commit_is_served_from_the_fixed_name(host, tmp_path):
    host.add(HostedCommit(A, legacy=True))
    with provider(host, tmp_path, pinned=CUDA12) as p:
        assert p.get(A).files[MEMBER].read_bytes() == so_bytes(A)
    assert host.asked() == [
        f"/{A}/cu129/vllm/metadata.json", f"/{A}/vllm/metadata.json",
        f"/{A}/{LEGACY_WHEEL}", f"/{A}/{LEGACY_WHEEL}", f"/{A}/{LEGACY_WHEEL}",
    ]


# --- plan: one small request a candidate, availability and bytes --------------------------------


def test_plan_checks_availability_with_one_request_a_candidate_and_estimates_bytes(
    host, builds, tmp_path
):
    now = time.time()
    host.add(HostedCommit(A), HostedCommit(B), HostedCommit(C))
    facts = {A: CommitFacts(True, now - 86400), B: CommitFacts(True, now - 86400),
             C: CommitFacts(True, now - 86400), D: CommitFacts(False, now - 86400),
             E: CommitFacts(True, now - 300)}
    candidates = [(c, ()) for c in (A, B, C, D, E)]
    origins, unreachable, fetch = locate_all(
        settings(host, tmp_path), candidates, None, pinned_cuda=CUDA13, facts=facts,
        estimate=True)
    assert [o.source for o in origins] == ["wheel-index"] * 3 + ["", ""]
    assert [o.no_wheel[0] if o.no_wheel else "" for o in origins] == \
        ["", "", "", "not on main", "too new"]
    metadata = [p for p in host.asked() if p.endswith("metadata.json")]
    assert metadata[:3] == [f"/{c}/cu130/vllm/metadata.json" for c in (A, B, C)]
    assert builds.calls == [(A, "cu130")]  # one central directory read, of A's wheel only
    assert host.ranges() == ["bytes=-42", host.ranges()[1]] and len(host.ranges()) == 2
    with zipfile.ZipFile(builds(A, "cu130")) as archive:
        compressed = archive.getinfo(MEMBER).compress_size
        directory = builds(A, "cu130").stat().st_size - archive.start_dir
    assert fetch is not None and fetch.candidates == 3 and fetch.sampled == A
    assert fetch.members == compressed and fetch.directory == directory
    assert fetch.total == 3 * fetch.per_candidate and not fetch.exact
    lines = [CandidateLine(i, c, c[:12], "", o.name, o.detail, "",
                           o.no_wheel[1] if o.no_wheel else "",
                           o.no_wheel[0] if o.no_wheel else "")
             for i, ((c, _), o) in enumerate(zip(candidates, origins, strict=True))]
    text = "\n".join(render_availability(availability(lines, fetch)))
    assert "3 with a wheel, 0 need a source build, 2 none" in text
    assert "no wheel (not on main): 1" in text and "no wheel (too new): 1" in text
    assert "an estimate: read from the wheel of aaaaaaaaaaaa" in text


# --- every network step has a deadline (issue 38) -----------------------------------------------


def test_a_trickling_index_stops_at_the_deadline_not_hours_later(host, tmp_path):
    host.add(HostedCommit(A))
    host.rate_bps = 1  # one byte a second: every read arrives in time, the body never does
    with httpx.Client(timeout=5.0) as client:
        downloader = Downloader(client, RetryPolicy(attempts=1), deadline_s=1.5)
        start = time.monotonic()
        with pytest.raises(GaveUp, match="deadline of 2 s"):
            downloader.get(f"{host.url}/{A}/vllm/metadata.json")
        took = time.monotonic() - start
    assert took < 6  # the deadline, plus at most one byte's wait


def test_plan_on_a_trickling_index_says_so_in_seconds(host, tmp_path, monkeypatch):
    import bisect_tool.artifacts.origins as origins_module

    monkeypatch.setattr(origins_module, "PLAN_DEADLINE_S", 1.5)
    host.add(HostedCommit(A), HostedCommit(B))
    host.rate_bps = 1
    start = time.monotonic()
    origins, unreachable, _ = locate_all(
        settings(host, tmp_path), [(A, ()), (B, ())], None, pinned_cuda=CUDA13, estimate=True)
    took = time.monotonic() - start
    assert [o.source for o in origins] == ["", ""]
    assert "deadline" in unreachable["wheel-index"]
    assert took < 10  # said once, B not asked again


def test_a_demollm_wheel_is_served_member_first(demollm_wheels, tmp_path):
    """The demo's case: the lead's demo builds a commit's real demollm wheel on first request;
    only ``demollm/_kernels.so`` travels."""
    from wheelindex import make_demollm_wheel

    def build(commit: str, variant: str) -> Path:
        return make_demollm_wheel("0.27.0.dev5", demollm_wheels.kernels["fixed"],
                                  tmp_path / "built" / commit[:8])

    with WheelHost(build, package="demollm") as host:
        host.add(HostedCommit(A))
        cfg = settings(host, tmp_path, package="demollm", swap_set=("demollm/_kernels.so",))
        with make_provider(cfg, tmp_path, retry=QUICK,
                           pinned_cuda=PinnedCuda("", "not known")) as p:
            swap = p.get(A)
        assert swap.files["demollm/_kernels.so"].read_bytes() == \
            demollm_wheels.kernels["fixed"].read_bytes()
        assert host.asked()[0] == f"/{A}/demollm/metadata.json"  # no CUDA: the default folder
        assert os.path.basename(host.asked()[1]).startswith("demollm-0.27.0.dev5%2Bg")

"""Simple-index project pages (PEP 503 HTML, PEP 691 JSON) and the test index of real demollm
wheels that tests/wheelindex.py builds and serves."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import httpx
import pytest
from wheelindex import (
    OLD_RMS_NORM,
    PACKAGE,
    PINNED_RMS_NORM,
    RELEASES,
    DemoIndex,
    IndexEntry,
)

from bisect_tool.artifacts.download import Downloader, GaveUp, NotFound, RetryPolicy
from bisect_tool.artifacts.index import (
    IndexFile,
    fetch_project_files,
    parse_html,
    parse_json,
    parse_project_page,
)
from bisect_tool.artifacts.sources import wheel_rank
from bisect_tool.demo.pinned import SWAP_PATH
from bisect_tool.errors import ArtifactUnavailable, IncompatibleExtension
from bisect_tool.runtime.schemas import check_pair, dump_local

PAGE = "https://index.example/simple/vllm/"
SHA = "ab" * 32


class Sleeps(list[float]):
    """Records the waits a retry policy asked for, without waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


# ---- PEP 503 HTML --------------------------------------------------------------------------


def test_html_page_gives_names_urls_hashes_yanked_and_requires_python():
    page = f"""<!DOCTYPE html><html><body>
      <a href="../../files/vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl#sha256={SHA}"
         data-requires-python="&gt;=3.9,&lt;3.14">vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl</a>
      <a href="https://other.example/p/vllm-0.25.0.tar.gz" data-yanked="">vllm-0.25.0.tar.gz</a>
      <a href="/files/vllm-0.24.0.tar.gz" data-yanked>vllm-0.24.0.tar.gz</a>
      <a href="vllm-0.23.0.tar.gz#md5=00" data-yanked="bad &amp; broken &quot;build&quot;">
         vllm-0.23.0.tar.gz</a>
    </body></html>"""
    files = parse_html(page, PAGE)
    assert files == [
        IndexFile(
            "vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl",
            "https://index.example/files/vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl",
            SHA,
            None,
            ">=3.9,<3.14",
        ),
        IndexFile("vllm-0.25.0.tar.gz", "https://other.example/p/vllm-0.25.0.tar.gz", "", ""),
        IndexFile("vllm-0.24.0.tar.gz", "https://index.example/files/vllm-0.24.0.tar.gz", "", ""),
        IndexFile(
            "vllm-0.23.0.tar.gz",
            "https://index.example/simple/vllm/vllm-0.23.0.tar.gz",
            "",  # only sha256 is taken from a fragment
            'bad & broken "build"',
        ),
    ]
    assert [f.is_yanked for f in files] == [False, True, True, True]


def test_html_name_falls_back_to_the_url_and_base_href_is_honoured():
    page = (
        '<html><head><base href="https://mirror.example/pkgs/"></head><body>'
        '<a href="vllm-0.26.0%2Bcu130-cp38-abi3-manylinux1_x86_64.whl"></a>'
        "<a>no href</a></body></html>"
    )
    (only,) = parse_html(page, PAGE)
    assert only.filename == "vllm-0.26.0+cu130-cp38-abi3-manylinux1_x86_64.whl"
    assert (
        only.url
        == "https://mirror.example/pkgs/vllm-0.26.0%2Bcu130-cp38-abi3-manylinux1_x86_64.whl"
    )


# ---- PEP 691 JSON --------------------------------------------------------------------------


def test_json_page_yanked_as_bool_or_reason_and_relative_urls():
    doc = {
        "meta": {"api-version": "1.0"},
        "name": "vllm",
        "files": [
            {
                "filename": "vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl",
                "url": "../../files/vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl",
                "hashes": {"sha256": SHA.upper()},
                "requires-python": ">=3.9",
                "yanked": False,
            },
            {"filename": "vllm-0.25.0.tar.gz", "url": "/f/a.tar.gz", "hashes": {}, "yanked": True},
            {
                "filename": "vllm-0.24.0.tar.gz",
                "url": f"https://cdn.example/b.tar.gz#sha256={SHA}",
                "hashes": {},
                "yanked": "broken build",
            },
            {"filename": "vllm-0.23.0.tar.gz", "url": "c.tar.gz", "hashes": {}, "yanked": ""},
        ],
    }
    files = parse_json(doc, PAGE)
    assert [f.url for f in files] == [
        "https://index.example/files/vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl",
        "https://index.example/f/a.tar.gz",
        "https://cdn.example/b.tar.gz",
        "https://index.example/simple/vllm/c.tar.gz",
    ]
    assert [f.sha256 for f in files] == [SHA, "", SHA, ""]  # lower-cased; fragment as fallback
    assert [f.yanked for f in files] == [None, "", "broken build", None]  # "" is false, as pip
    assert files[0].requires_python == ">=3.9" and files[1].requires_python == ""


def test_the_content_type_picks_the_parser_and_a_broken_json_page_is_a_value_error():
    html_page = f'<a href="x-1.0.tar.gz#sha256={SHA}">x-1.0.tar.gz</a>'
    assert parse_project_page(html_page, "text/html", PAGE)[0].sha256 == SHA
    with pytest.raises(ValueError):
        parse_project_page("<html>", "application/vnd.pypi.simple.v1+json", PAGE)
    with pytest.raises(ValueError):
        parse_json({"files": "nope"}, PAGE)


# ---- against the real test index ------------------------------------------------------------


def test_the_test_index_negotiates_json_and_html_to_the_same_files(demollm_wheels):
    with httpx.Client() as client:
        with DemoIndex.of(demollm_wheels) as index:
            json_files, page = fetch_project_files(Downloader(client), index.index_url, PACKAGE)
            assert "application/vnd.pypi.simple.v1+json" in index.accepts[-1]
            # The listed URL (relative on the page) resolves to the wheel itself.
            served = client.get(json_files[3].url).content
        with DemoIndex.of(demollm_wheels, html_only=True) as index:
            # Any spelling of the name finds the PEP 503-normalised page.
            html_files, _ = fetch_project_files(Downloader(client), index.index_url, "DemoLLM")
            assert index.gets[f"/simple/{PACKAGE}/"] == 1
    assert page.endswith(f"/simple/{PACKAGE}/")
    assert [f.filename for f in json_files] == [r.filename for r in RELEASES]
    for a, b in zip(json_files, html_files, strict=True):
        assert (a.filename, a.sha256, a.yanked, a.requires_python) == (
            b.filename,
            b.sha256,
            b.yanked,
            b.requires_python,
        )
    yanked = {f.filename: f.yanked for f in json_files if f.is_yanked}
    assert yanked == {f"{PACKAGE}-0.26.1-py3-none-linux_x86_64.whl": "broken build"}
    wheel = json_files[3]
    assert wheel.sha256 == hashlib.sha256(demollm_wheels.wheels["0.26.0"].read_bytes()).hexdigest()
    assert served == demollm_wheels.wheels["0.26.0"].read_bytes()


def test_unknown_project_is_not_found_and_a_stopped_index_gives_up(demollm_index):
    sleeps = Sleeps()
    policy = RetryPolicy(attempts=3, wait_initial_s=0.25, sleep=sleeps)
    with httpx.Client() as client:
        downloader = Downloader(client, policy)
        with pytest.raises(NotFound):
            fetch_project_files(downloader, demollm_index.index_url, "no-such-project")
        assert downloader.requests == 1  # a 404 is an answer: not retried
        demollm_index.stop()
        with pytest.raises(GaveUp, match="gave up after 3 attempts"):
            fetch_project_files(downloader, demollm_index.index_url, PACKAGE)
    assert downloader.requests == 1 + 3
    assert sleeps == [0.25, 0.5]


def test_a_page_that_is_no_index_page_is_unavailable_in_one_line():
    entries = [IndexEntry("x-1.0.tar.gz", b"x")]
    with DemoIndex(entries, package="x") as index, httpx.Client() as client:
        # A JSON content type with a body that is no JSON (a proxy's error page, say).
        index._json = lambda entries: b"<html>proxy error</html>"  # type: ignore[method-assign]
        with pytest.raises(ArtifactUnavailable) as err:
            fetch_project_files(Downloader(client), index.index_url, "x")
    assert "is not a simple-index page" in str(err.value) and "\n" not in str(err.value)


def test_a_quick_downloader_counts_into_its_parent(demollm_index):
    with httpx.Client() as client:
        parent = Downloader(client)
        quick = parent.with_policy(RetryPolicy(attempts=1), timeout=httpx.Timeout(5.0))
        quick.get(demollm_index.index_url + f"/{PACKAGE}/")
    assert quick.requests == parent.requests == 1
    assert parent.bytes_received == quick.bytes_received > 0
    assert quick.retry.attempts == 1 and parent.retry.attempts == RetryPolicy().attempts


# ---- the test index's wheels are what they claim ----------------------------------------------


def test_demo_wheels_are_real_wheels_the_pinned_stack_can_pick(demollm_wheels):
    for release in RELEASES:
        path = demollm_wheels.wheels[release.version]
        assert path.name == release.filename
        assert wheel_rank(path.name) is not None
        with zipfile.ZipFile(path) as archive:
            assert archive.testzip() is None
            names = archive.namelist()
            info = f"{PACKAGE}-{release.version}.dist-info"
            assert {f"{info}/METADATA", f"{info}/WHEEL", f"{info}/RECORD"} <= set(names)
            assert {SWAP_PATH, f"{PACKAGE}/_custom_ops.py", f"{PACKAGE}/server.py"} <= set(names)
            assert archive.read(SWAP_PATH) == demollm_wheels.kernel_bytes(release.version)
            record = archive.read(f"{info}/RECORD").decode().splitlines()
            for line in record:
                name, digest, size = line.rsplit(",", 2)
                if name.endswith("/RECORD"):
                    assert digest == size == ""
                    continue
                data = archive.read(name)
                expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert digest == "sha256=" + expected.decode() and int(size) == len(data)
            assert f"Version: {release.version}" in archive.read(f"{info}/METADATA").decode()
    variants = demollm_wheels.kernels
    assert len({p.read_bytes() for p in variants.values()}) == 3  # three distinct builds


def _block_size(so: str, num_tokens: int, batch_invariant: bool) -> int:
    # A fresh process per question: the kernel reads VLLM_BATCH_INVARIANT once and caches it.
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]);"
        "print(lib.demollm_rms_norm_block_size(ctypes.c_int64(int(sys.argv[2])),"
        " ctypes.c_int64(4096)))"
    )
    env = {**os.environ, "VLLM_BATCH_INVARIANT": "1" if batch_invariant else "0"}
    done = subprocess.run(
        [sys.executable, "-c", code, so, str(num_tokens)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_kernel_variants_carry_the_bug_the_fix_and_the_old_schema(demollm_wheels):
    prefix, fixed, schema = (str(demollm_wheels.kernels[v]) for v in ("prefix", "fixed", "schema"))
    # The bug: in batch-invariant mode the block size still follows the batch's token count.
    assert _block_size(prefix, 16, True) == 1024 and _block_size(prefix, 512, True) == 256
    assert _block_size(fixed, 16, True) == 1024 and _block_size(fixed, 512, True) == 1024
    assert _block_size(fixed, 512, False) == 256  # the fix only pins it in that mode
    pinned = dump_local(sys.executable, prefix, what="pinned")
    assert pinned is not None and pinned["_C::rms_norm"] == PINNED_RMS_NORM
    check_pair(SWAP_PATH, pinned, dump_local(sys.executable, fixed, what="fixed") or {}, "fixed")
    old = dump_local(sys.executable, schema, what="schema")
    assert old is not None and old["_C::rms_norm"] == OLD_RMS_NORM
    with pytest.raises(IncompatibleExtension) as err:
        check_pair(SWAP_PATH, pinned, old, "demollm-0.25.0")
    assert "_C::rms_norm" in str(err.value) and "Tensor weight" in str(err.value)


def test_the_index_json_is_pep_691(demollm_index):
    response = httpx.get(
        demollm_index.index_url + f"/{PACKAGE}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    doc = json.loads(response.text)
    assert response.headers["content-type"] == "application/vnd.pypi.simple.v1+json"
    assert doc["meta"]["api-version"] == "1.0" and doc["name"] == PACKAGE
    assert httpx.get(demollm_index.index_url + "/other/").status_code == 404

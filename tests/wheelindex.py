"""A real simple index on loopback holding real wheels of the demo engine ``demollm``.

The wheels are built here, in the test session: the demo's C kernel (bisect_tool/demo/stack) is
compiled with its own setup.py in three variants and zipped with the engine's Python files and a
dist-info whose RECORD carries each file's sha256 (PEP 376/427):

- ``prefix``: the kernel as shipped (the block size depends on num_tokens: the bug),
- ``fixed``: the planted fix of the demo history applied (history._BLOCK_LINE -> _FIXED_BLOCK),
- ``schema``: ``prefix`` but ``_C::rms_norm`` takes a required ``Tensor weight``, which the
  pinned stack's compatibility gate rejects, naming the op.

``DemoIndex`` serves them (PEP 691 JSON when asked for, else PEP 503 HTML) from a
``ThreadingHTTPServer`` on 127.0.0.1, counts requests, and can be stopped mid-test to play an
offline machine. The fixtures in conftest.py build the wheels once per session
(``demollm_wheels``) and start an index per test (``demollm_index``).
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import http.server
import json
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, unquote

from bisect_tool.artifacts.testing import LoopbackHTTP
from bisect_tool.artifacts.wheelhost import write_wheel
from bisect_tool.demo import history
from bisect_tool.demo.pinned import STACK_DIR, SWAP_PATH, run_build

PACKAGE = "demollm"
KERNEL_SOURCE = "csrc/layernorm_kernels.c"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"

PINNED_RMS_NORM = "_C::rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()"
OLD_RMS_NORM = "_C::rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()"


@dataclass(frozen=True)
class DemoRelease:
    version: str
    variant: str  # "prefix", "fixed" or "schema"
    yanked: str | None = None  # the reason; None: not yanked

    @property
    def filename(self) -> str:
        return f"{PACKAGE}-{self.version}-py3-none-linux_x86_64.whl"


# The test index's releases, oldest first. The fix lands in 0.27.0 (0.27.0rc1 already has it);
# 0.25.0 has an extension the pinned stack cannot load; 0.26.1 is yanked.
RELEASES: tuple[DemoRelease, ...] = (
    DemoRelease("0.24.0", "prefix"),
    DemoRelease("0.25.0", "schema"),
    DemoRelease("0.25.1", "prefix"),
    DemoRelease("0.26.0", "prefix"),
    DemoRelease("0.26.1", "prefix", yanked="broken build"),
    DemoRelease("0.27.0rc1", "fixed"),
    DemoRelease("0.27.0", "fixed"),
    DemoRelease("0.28.0", "fixed"),
)
VARIANTS = ("prefix", "fixed", "schema")


def _patched_kernel(text: str, variant: str) -> str:
    if variant == "prefix":
        return text
    if variant == "fixed":
        # The planted fix, exactly as the demo history plants it.
        assert history._BLOCK_LINE in text, "the demo kernel no longer has the buggy line"
        return text.replace(history._BLOCK_LINE, history._FIXED_BLOCK)
    if variant == "schema":
        assert f'"{PINNED_RMS_NORM}\\n"' in text, "the demo kernel's OP_SCHEMAS changed"
        return text.replace(f'"{PINNED_RMS_NORM}\\n"', f'"{OLD_RMS_NORM}\\n"')
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")


def build_kernels(variant: str, work: Path) -> Path:
    """Compile ``demollm/_kernels.so`` of ``variant`` in a copy of the demo stack under
    ``work`` with the stack's own ``setup.py build_ext --inplace``; returns the .so."""
    root = work / f"stack-{variant}"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(
        STACK_DIR,
        root,
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.source-sha256", ".build.lock"),
    )
    kernel = root / KERNEL_SOURCE
    kernel.write_text(_patched_kernel(kernel.read_text(), variant))
    return run_build(root, python=sys.executable)


def make_demollm_wheel(
    version: str, kernels: Path, out_dir: Path, *, tag: str = "py3-none-linux_x86_64"
) -> Path:
    """A real wheel of demollm ``version``: the engine's Python files from the demo stack, the
    given ``_kernels.so`` and a dist-info (METADATA, WHEEL, RECORD with sha256 and sizes), by
    the package's own wheel writer (``bisect_tool.artifacts.wheelhost.write_wheel``)."""
    members: dict[str, bytes] = {
        f"{PACKAGE}/{path.name}": path.read_bytes()
        for path in sorted((STACK_DIR / PACKAGE).glob("*.py"))
    }
    members[SWAP_PATH] = kernels.read_bytes()
    return write_wheel(out_dir / f"{PACKAGE}-{version}-{tag}.whl", members,
                       name=PACKAGE, version=version, tag=tag)


@dataclass(frozen=True)
class DemoWheels:
    kernels: Mapping[str, Path]  # variant -> its _kernels.so
    wheels: Mapping[str, Path]  # version -> its wheel
    releases: tuple[DemoRelease, ...] = RELEASES

    def release(self, version: str) -> DemoRelease:
        return next(r for r in self.releases if r.version == version)

    def kernel_bytes(self, version: str) -> bytes:
        """The ``_kernels.so`` the wheel of ``version`` holds."""
        return self.kernels[self.release(version).variant].read_bytes()


def build_demo_wheels(work: Path, releases: Sequence[DemoRelease] = RELEASES) -> DemoWheels:
    """Every release's wheel; each distinct variant compiled once."""
    kernels = {v: build_kernels(v, work) for v in sorted({r.variant for r in releases})}
    wheels = {
        r.version: make_demollm_wheel(r.version, kernels[r.variant], work / "wheels")
        for r in releases
    }
    return DemoWheels(kernels, wheels, tuple(releases))


@dataclass(frozen=True)
class IndexEntry:
    filename: str
    data: bytes
    yanked: str | None = None
    requires_python: str = ">=3.11"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


class DemoIndex:
    """A simple index of one project on 127.0.0.1 (a free port). Use as a context manager; it
    always shuts down. ``stop()`` ends serving early (the index is then unreachable: connection
    refused, as on an offline machine). ``gets`` counts requests per path; ``accepts`` keeps the
    Accept header of each project-page request. ``html_only`` plays an index that only speaks
    PEP 503."""

    def __init__(
        self,
        entries: Sequence[IndexEntry],
        *,
        package: str = PACKAGE,
        html_only: bool = False,
    ) -> None:
        self.package = package
        self.entries = list(entries)
        self.html_only = html_only
        self.gets: Counter[str] = Counter()
        self.accepts: list[str] = []
        self._lock = threading.Lock()
        self._http = LoopbackHTTP(self._handle)
        self.url = self._http.url

    @classmethod
    def of(cls, wheels: DemoWheels, *, html_only: bool = False) -> DemoIndex:
        """The index of the demo releases, 0.26.1 yanked as RELEASES says."""
        entries = [
            IndexEntry(r.filename, wheels.wheels[r.version].read_bytes(), r.yanked)
            for r in wheels.releases
        ]
        return cls(entries, html_only=html_only)

    @property
    def index_url(self) -> str:
        """What PIP_INDEX_URL would be set to."""
        return f"{self.url}/simple"

    @property
    def project_path(self) -> str:
        return f"/simple/{self.package}/"

    def add(self, entry: IndexEntry) -> None:
        with self._lock:
            self.entries.append(entry)

    def __enter__(self) -> DemoIndex:
        self._http.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving and close the listening socket (idempotent)."""
        self._http.stop()

    # --- pages -----------------------------------------------------------------------------
    def _html(self, entries: Sequence[IndexEntry]) -> bytes:
        links = []
        for e in entries:
            attrs = f' data-requires-python="{html.escape(e.requires_python)}"'
            if e.yanked is not None:
                attrs += f' data-yanked="{html.escape(e.yanked)}"'
            # Relative links: a client must resolve them against the page's URL.
            href = f"../../files/{quote(e.filename)}#sha256={e.sha256}"
            links.append(f'    <a href="{href}"{attrs}>{html.escape(e.filename)}</a><br/>\n')
        page = (
            "<!DOCTYPE html>\n<html>\n  <head>\n"
            '    <meta name="pypi:repository-version" content="1.0">\n'
            f"    <title>Links for {self.package}</title>\n  </head>\n  <body>\n"
            f"    <h1>Links for {self.package}</h1>\n{''.join(links)}  </body>\n</html>\n"
        )
        return page.encode()

    def _json(self, entries: Sequence[IndexEntry]) -> bytes:
        files = []
        for e in entries:
            item: dict[str, object] = {
                "filename": e.filename,
                "url": f"../../files/{quote(e.filename)}",
                "hashes": {"sha256": e.sha256},
                "requires-python": e.requires_python,
            }
            if e.yanked is not None:
                # PEP 691: a reason string, or true when none was given.
                item["yanked"] = e.yanked or True
            files.append(item)
        doc = {"meta": {"api-version": "1.0"}, "name": self.package, "files": files}
        return json.dumps(doc).encode()

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        path = unquote(handler.path.split("?", 1)[0])
        accept = handler.headers.get("Accept", "")
        with self._lock:
            self.gets[path] += 1
            entries = list(self.entries)
        body: bytes | None = None
        content_type = "application/octet-stream"
        if path == self.project_path:
            with self._lock:
                self.accepts.append(accept)
            if JSON_TYPE in accept and not self.html_only:
                body, content_type = self._json(entries), JSON_TYPE
            else:
                body, content_type = self._html(entries), "text/html; charset=utf-8"
        elif path.startswith("/files/"):
            name = path[len("/files/") :]
            body = next((e.data for e in entries if e.filename == name), None)
        if body is None:
            handler.send_error(404)
            return
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client left
            handler.wfile.write(body)

"""A per-commit wheel index on loopback, laid out as vLLM publishes one (for tests, the bench and
the demo).

The layout, from vLLM's docs/contributing/ci/nightly_builds.md and its index generator
(.buildkite/scripts/generate-nightly-index.py), as vllm-facts.md sums it up:

- the wheels of a commit sit in ``/{commit}/``: the default build unsuffixed
  (``vllm-0.27.0.dev5+g0123abcde-cp38-abi3-manylinux_2_28_x86_64.whl``), a variant build with
  its variant in the version's local part (``...+g0123abcde.cu129-...``, or ``0.27.0+cu129`` for
  a version without one);
- ``/{commit}/vllm/metadata.json`` lists the default build, ``/{commit}/{variant}/vllm/``
  each variant's (``cu129``, ``cu130``, ``cpu``); the default's own variant has a folder too,
  an alias listing the default build (its entries' ``variant`` null), as the generator's
  ``--alias-to-default`` makes it; a PEP 503 ``index.html`` beside each metadata.json;
- each entry: package_name, version, build_tag, python_tag, abi_tag, platform_tag, variant,
  filename and ``path``, relative to the metadata's folder, quoted as S3 needs it (``+`` as
  ``%2B``); one entry per architecture (x86_64, aarch64);
- commits from before metadata.json have one wheel under a fixed name,
  ``vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl``; commits without wheels (a release
  branch's, a just-merged one) have nothing: 404.

``WheelHost`` serves that from a ``ThreadingHTTPServer`` on 127.0.0.1: GET and HEAD, single
byte ranges (``testing.byte_range``: 206 with Content-Range; ``ignore_ranges`` answers 200
with the whole file, as some servers do), bytes sent counted per path, an optional bandwidth
(``rate_bps``, shared by every connection, as one link is), and the wheels built lazily by a
callable ``build(commit, variant) -> Path`` on their first request (once per build, however
many ask at once). Stdlib only.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import json
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, unquote

from bisect_tool.artifacts.testing import LoopbackHTTP, byte_range

#: the fixed name of a commit's wheel before metadata.json existed (vllm-facts.md)
LEGACY_WHEEL = "vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl"


def legacy_name(package: str) -> str:
    return LEGACY_WHEEL.replace("vllm-", f"{package}-", 1)


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def write_wheel(
    path: Path,
    members: Mapping[str, bytes],
    *,
    name: str,
    version: str,
    tag: str = "py3-none-linux_x86_64",
    requires_python: str = ">=3.11",
    compression: int = zipfile.ZIP_DEFLATED,
) -> Path:
    """A real wheel at ``path``: ``members`` and a dist-info (METADATA, WHEEL, and a RECORD with
    each file's sha256 and size, PEP 376/427)."""
    files = dict(members)
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        f"Requires-Python: {requires_python}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: bisect-tool\nRoot-Is-Purelib: false\nTag: {tag}\n"
    ).encode()
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


@dataclass(frozen=True)
class HostedCommit:
    """What the index holds for one commit.

    ``default``: the CUDA variant the unsuffixed default build is (``cu129`` before vLLM PR
    #39878, April 2026; ``cu130`` after), None for no default build. ``variants``: the variant
    folders (the default's own one, an alias, included when listed). ``legacy``: only the fixed
    legacy name in the commit folder, no metadata.json. ``version``: "" makes a dev version
    with the commit in its local part, as CI names them."""

    commit: str
    default: str | None = "cu130"
    variants: tuple[str, ...] = ("cu130", "cu129")
    version: str = ""
    platform: str = "manylinux_2_28"
    arches: tuple[str, ...] = ("x86_64", "aarch64")
    legacy: bool = False

    @property
    def base_version(self) -> str:
        return self.version or f"0.27.0.dev5+g{self.commit[:9]}"


@dataclass(frozen=True)
class HostedFile:
    """One wheel the index serves: which build of which commit it is."""

    commit: str
    variant: str  # the build's CUDA variant ("" for a legacy wheel)
    filename: str


@dataclass(frozen=True)
class Served:
    """One request as the host saw it."""

    method: str
    path: str  # as requested (still quoted)
    range: str  # the Range header, "" if none
    status: int
    sent: int  # body bytes written


@dataclass
class WheelHost:
    """vLLM's per-commit wheel index on 127.0.0.1 (a free port). Use as a context manager.

    ``build(commit, variant)`` returns the path of the wheel to serve for that build; it is
    called on the first request of that file (metadata.json needs no build)."""

    build: Callable[[str, str], Path]
    package: str = "vllm"
    rate_bps: int | None = None
    ignore_ranges: bool = False
    commits: dict[str, HostedCommit] = field(default_factory=dict)
    requests: list[Served] = field(default_factory=list)
    sent: Counter[str] = field(default_factory=Counter)  # unquoted path -> body bytes
    builds: Counter[tuple[str, str]] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._built: dict[tuple[str, str], Path] = {}
        self._build_locks: dict[tuple[str, str], threading.Lock] = {}
        self._free_at = 0.0
        self._stopping = threading.Event()
        self._http = LoopbackHTTP(self._handle, head=True)

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self._http.url

    def __enter__(self) -> WheelHost:
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
        """Stop serving (idempotent); a throttled transfer under way ends at once."""
        self._stopping.set()
        self._http.stop()

    # --- content -----------------------------------------------------------------------------
    def add(self, *commits: HostedCommit) -> None:
        with self._lock:
            for hosted in commits:
                self.commits[hosted.commit] = hosted

    def filename(self, hosted: HostedCommit, variant: str | None, arch: str = "x86_64") -> str:
        """The wheel's name: the default build unsuffixed, a variant's in the local version."""
        version = hosted.base_version
        if variant is not None:
            version += ("." if "+" in version else "+") + variant
        return f"{self.package}-{version}-cp38-abi3-{hosted.platform}_{arch}.whl"

    def wheel_url(self, commit: str, variant: str | None = None, arch: str = "x86_64") -> str:
        """Where the build of ``commit`` is served (``variant`` None: the default build)."""
        hosted = self.commits[commit]
        if hosted.legacy:
            return f"{self.url}/{commit}/{legacy_name(self.package)}"
        return f"{self.url}/{commit}/{quote(self.filename(hosted, variant, arch), safe=':%/')}"

    def _entries(self, hosted: HostedCommit, variant: str | None) -> list[dict[str, object]]:
        """metadata.json of the default folder (``variant`` None) or a variant folder."""
        listed: str | None = variant  # which build the folder lists: None is the default one
        if variant is not None and variant == hosted.default:
            listed = None  # the alias folder of the default variant lists the default build
        up = "../" if variant is None else "../../"
        entries: list[dict[str, object]] = []
        for arch in hosted.arches:
            filename = self.filename(hosted, listed, arch)
            entries.append({
                "package_name": self.package,
                "version": hosted.base_version,
                "build_tag": None,
                "python_tag": "cp38",
                "abi_tag": "abi3",
                "platform_tag": f"{hosted.platform}_{arch}",
                "variant": listed,
                "filename": filename,
                # S3's quoting, as the generator writes it: "+" becomes %2B
                "path": quote(up + filename, safe=":%/"),
            })
        return sorted(entries, key=lambda e: str(e["filename"]))

    def _page(self, links: Iterable[tuple[str, str]]) -> bytes:
        items = "\n".join(f'    <a href="{href}">{html.escape(text)}</a><br/>'
                          for href, text in links)
        return ("<!DOCTYPE html>\n<html>\n  <meta name=\"pypi:repository-version\" "
                f"content=\"1.0\">\n  <body>\n{items}\n  </body>\n</html>\n").encode()

    def _resolve(self, path: str) -> tuple[bytes | HostedFile, str] | None:
        """What ``path`` (unquoted) serves: a page's bytes or a wheel, and its content type."""
        parts = [p for p in path.split("/") if p]
        if not parts:
            return None
        with self._lock:
            hosted = self.commits.get(parts[0])
        if hosted is None:
            return None
        rest = parts[1:]
        if hosted.legacy:
            if rest == [legacy_name(self.package)]:
                return HostedFile(hosted.commit, "", rest[0]), "application/octet-stream"
            return None
        if len(rest) == 1 and rest[0].endswith(".whl"):
            return self._wheel(hosted, rest[0])
        return self._listing(hosted, rest)

    def _wheel(self, hosted: HostedCommit, name: str) -> tuple[HostedFile, str] | None:
        """The wheel file ``name`` of ``hosted``'s folder, if it has one."""
        # the default build (unsuffixed) and each variant's own; the default's alias folder
        # lists the default build, so no suffixed file of the default's variant exists
        builds: list[tuple[str | None, str]] = []
        if hosted.default is not None:
            builds.append((None, hosted.default))
        builds += [(v, v) for v in hosted.variants if v != hosted.default]
        for suffix, build in builds:
            for arch in hosted.arches:
                if self.filename(hosted, suffix, arch) == name:
                    return HostedFile(hosted.commit, build, name), "application/octet-stream"
        return None

    def _listing(self, hosted: HostedCommit, rest: list[str]) -> tuple[bytes, str] | None:
        """The page ``rest`` names in ``hosted``'s folder: the folder's index, a variant's, the
        package's page of links, or its metadata.json."""
        folders: dict[str | None, bool] = {v: True for v in hosted.variants}
        if hosted.default is not None:
            folders[None] = True
        if rest in ([], ["index.html"]):
            links = [(f"{self.package}/", f"{self.package}/")] if None in folders else []
            links += [(f"{v}/", f"{v}/") for v in sorted(hosted.variants)]
            return self._page(links), "text/html"
        variant: str | None = None
        if rest and rest[0] != self.package:
            variant, rest = rest[0], rest[1:]
        if variant not in folders:
            return None
        if rest in ([], ["index.html"]):
            return self._page([(f"{self.package}/", f"{self.package}/")]), "text/html"
        if rest[0] != self.package:
            return None
        entries = self._entries(hosted, variant)
        if rest[1:] == ["metadata.json"]:
            return json.dumps(entries, indent=2).encode(), "application/json"
        if rest[1:] in ([], ["index.html"]):
            return self._page((str(e["path"]), str(e["filename"])) for e in entries), \
                "text/html"
        return None

    def wheel_path(self, commit: str, variant: str) -> Path:
        """The built wheel of that build (built now if it was not)."""
        key = (commit, variant)
        with self._lock:
            lock = self._build_locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                built = self._built.get(key)
            if built is None:
                built = Path(self.build(commit, variant))
                with self._lock:
                    self._built[key] = built
                    self.builds[key] += 1
            return built

    # --- serving -----------------------------------------------------------------------------
    def _throttle(self, n: int) -> bool:
        """Wait for ``n`` bytes' share of the bandwidth; False once the host stops."""
        rate = self.rate_bps
        if not rate:
            return not self._stopping.is_set()
        with self._lock:
            now = time.monotonic()
            start = max(now, self._free_at)
            self._free_at = start + n / rate
            wait = self._free_at - now
        return not self._stopping.wait(wait)

    def _chunk(self) -> int:
        rate = self.rate_bps
        return max(1, min(64 * 1024, rate // 20)) if rate else 1024 * 1024

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        raw = handler.path.split("?", 1)[0]
        path = unquote(raw)
        asked = handler.headers.get("Range", "")
        with self._lock:  # noted as it arrives (its status and bytes once answered)
            self.requests.append(Served(handler.command, raw, asked, 0, 0))
            index = len(self.requests) - 1

        def note(status: int, sent: int) -> None:
            with self._lock:
                self.requests[index] = Served(handler.command, raw, asked, status, sent)

        self._answer(handler, path, asked, note)

    def _answer(
        self,
        handler: http.server.BaseHTTPRequestHandler,
        path: str,
        asked: str,
        note: Callable[[int, int], None],
    ) -> None:
        found = self._resolve(path)
        if found is None:
            note(404, 0)
            handler.send_error(404)
            return
        content, content_type = found
        try:
            if isinstance(content, HostedFile):
                wheel = self.wheel_path(content.commit, content.variant)
                size = wheel.stat().st_size
            else:
                size = len(content)
        except Exception as exc:  # a build that fails: the client sees a 500, the test the cause
            note(500, 0)
            handler.send_error(500, explain=str(exc)[:200])
            return
        span = None if self.ignore_ranges else byte_range(asked, size)
        if span == "unsatisfiable":
            note(416, 0)
            handler.send_response(416)
            handler.send_header("Content-Range", f"bytes */{size}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        start, end = (0, size) if not isinstance(span, tuple) else span
        status = 206 if isinstance(span, tuple) else 200
        handler.send_response(status)
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        handler.send_header("Accept-Ranges", "none" if self.ignore_ranges else "bytes")
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(end - start))
        handler.end_headers()
        if handler.command == "HEAD":
            note(status, 0)
            return
        sent = 0
        try:
            if isinstance(content, HostedFile):
                with wheel.open("rb") as source:
                    source.seek(start)
                    sent = self._send(handler, path, lambda n: source.read(n), end - start)
            else:
                view = memoryview(content)[start:end]
                offset = [0]

                def take(n: int) -> bytes:
                    piece = bytes(view[offset[0] : offset[0] + n])
                    offset[0] += len(piece)
                    return piece

                sent = self._send(handler, path, take, end - start)
        finally:
            note(status, sent)

    def _send(
        self,
        handler: http.server.BaseHTTPRequestHandler,
        path: str,
        read: Callable[[int], bytes],
        length: int,
    ) -> int:
        sent = 0
        while sent < length:
            piece = read(min(self._chunk(), length - sent))
            if not piece or not self._throttle(len(piece)):
                break
            try:
                handler.wfile.write(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
            with self._lock:
                self.sent[path] += len(piece)
        if sent < length:
            handler.close_connection = True
        return sent

    # --- what the tests and the bench read ---------------------------------------------------
    def asked(self, method: str = "GET") -> list[str]:
        """The paths asked, in order (as requested: still quoted)."""
        with self._lock:
            return [r.path for r in self.requests if r.method == method]

    def ranges(self, path_end: str = ".whl") -> list[str]:
        """The Range headers of the GETs whose path ends with ``path_end``."""
        with self._lock:
            return [r.range for r in self.requests
                    if r.method == "GET" and r.path.endswith(path_end)]

    def bytes_sent(self, paths: Sequence[str] | None = None) -> int:
        with self._lock:
            if paths is None:
                return sum(self.sent.values())
            return sum(self.sent[unquote(p)] for p in paths)

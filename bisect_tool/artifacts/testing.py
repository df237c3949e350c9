"""A real wheel index on loopback for tests and the benchmark: vLLM's per-commit layout, a PEP
691/503 simple index, HTTP Range, and faults injected at the server (dropped body, 5xx, 429).

Stdlib only; binds 127.0.0.1 on a free port. Use as a context manager.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import zipfile
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote


def make_wheel(
    path: Path, members: Mapping[str, bytes], *, name: str = "vllm", stored: bool = False
) -> Path:
    """A real wheel zip: the members plus a minimal dist-info."""
    compression = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    info = f"{name}-0.0.0.dist-info"
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n")
    return path


def byte_range(header: str, size: int) -> tuple[int, int] | None | str:
    """The ``[start, end)`` a single-range ``Range`` header asks of a ``size``-byte file; None
    to answer with the whole file (no header, another unit, several ranges: RFC 9110 lets a
    server ignore those); ``"unsatisfiable"`` for 416."""
    header = header.strip()
    if not header.startswith("bytes=") or "," in header:
        return None
    first, sep, last = header[len("bytes="):].strip().partition("-")
    try:
        if not sep:
            return None
        if not first:  # a suffix: the last n bytes
            n = int(last)
            return (max(0, size - n), size) if n > 0 and size else "unsatisfiable"
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, end


class LoopbackHTTP:
    """A threaded stdlib HTTP server on 127.0.0.1 (a free port) whose GETs go to ``handle``.
    ``start()`` serves; ``stop()`` shuts down and closes the socket (idempotent: after it the
    port refuses connections, as an offline index does)."""

    def __init__(
        self, handle: Callable[[http.server.BaseHTTPRequestHandler], None], *, head: bool = False
    ) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if head else "HTTP/1.0"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                handle(self)

            def do_HEAD(self) -> None:  # noqa: N802
                if head:  # the handler answers HEAD itself (headers, no body)
                    handle(self)
                else:
                    self.send_error(501)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


@dataclass(frozen=True)
class Fault:
    # "drop" (half the body, then close), "status" (reply code), "pass" (served as usual: a
    # later request of the queue gets the fault)
    kind: str
    status: int = 0
    retry_after: str = ""


class WheelServer:
    """Serves ``files`` (URL path -> bytes). ``faults[path]`` is a queue consumed one per GET."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.content_types: dict[str, str] = {}
        self.releases: dict[str, list[tuple[str, str, str]]] = {}
        self.faults: dict[str, deque[Fault]] = defaultdict(deque)
        self.gets: Counter[str] = Counter()
        self.ranges: list[tuple[str, str]] = []
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._http = LoopbackHTTP(self._handle)

    @property
    def url(self) -> str:
        return self._http.url

    def __enter__(self) -> WheelServer:
        self._http.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.stop()

    # --- content -------------------------------------------------------------------------
    def add(self, path: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        self.files[unquote(path)] = data
        self.content_types[unquote(path)] = content_type
        return self.url + path

    def add_commit_wheel(
        self,
        commit: str,
        data: bytes,
        *,
        filename: str = "vllm-0.27.0.dev5+g0123abc.cu130-cp38-abi3-manylinux1_x86_64.whl",
        variant: str = "",
    ) -> str:
        """vLLM's layout: the wheel in ``/{commit}/``, metadata.json in ``[{variant}/]vllm/``
        whose ``path`` is relative and quoted (``+`` as ``%2B``). Returns the wheel's URL."""
        quoted = quote(filename, safe=":%/")
        wheel_path = f"/{commit}/{quoted}"
        folder = f"/{commit}/{variant}/vllm/" if variant else f"/{commit}/vllm/"
        up = "../../" if variant else "../"
        entry = {
            "package_name": "vllm",
            "version": "0.27.0.dev5",
            "build_tag": None,
            "python_tag": "cp38",
            "abi_tag": "abi3",
            "platform_tag": "manylinux1_x86_64",
            "variant": variant or None,
            "filename": filename,
            "path": up + quoted,
        }
        self.add(folder + "metadata.json", json.dumps([entry]).encode(), "application/json")
        return self.add(wheel_path, data)

    def add_release(
        self, package: str, filename: str, data: bytes, *, sha256: str = "", html: bool = False
    ) -> str:
        """Add a file to a PEP 691 (JSON) or PEP 503 (HTML) project page."""
        sha = sha256 or hashlib.sha256(data).hexdigest()
        file_url = self.add(f"/files/{quote(filename)}", data)
        listed = self.releases.setdefault(package, [])
        listed.append((filename, file_url, sha))
        if html:
            links = "".join(f'<a href="{u}#sha256={h}">{f}</a><br/>' for f, u, h in listed)
            self.add(f"/simple/{package}/", f"<html><body>{links}".encode(), "text/html")
        else:
            doc = {
                "meta": {"api-version": "1.0"},
                "name": package,
                "files": [{"filename": f, "url": u, "hashes": {"sha256": h}} for f, u, h in listed],
            }
            self.add(
                f"/simple/{package}/",
                json.dumps(doc).encode(),
                "application/vnd.pypi.simple.v1+json",
            )
        return file_url

    def fail(self, path: str, *faults: Fault) -> None:
        self.faults[unquote(path)].extend(faults)

    # --- serving -------------------------------------------------------------------------
    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        path = unquote(handler.path.split("?", 1)[0])
        with self._lock:
            self.gets[path] += 1
            rng = handler.headers.get("Range", "")
            if rng:
                self.ranges.append((path, rng))
            fault = self.faults[path].popleft() if self.faults.get(path) else None
        if fault is not None and fault.kind == "status":
            handler.send_response(fault.status)
            if fault.retry_after:
                handler.send_header("Retry-After", fault.retry_after)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        data = self.files.get(path)
        if data is None:
            handler.send_error(404)
            return
        span = byte_range(rng, len(data))
        if span == "unsatisfiable":
            handler.send_response(416)
            handler.send_header("Content-Range", f"bytes */{len(data)}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        start, end = span if isinstance(span, tuple) else (0, len(data))
        if isinstance(span, tuple):
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        else:
            handler.send_response(200)
        body = data[start:end]
        handler.send_header(
            "Content-Type", self.content_types.get(path, "application/octet-stream")
        )
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if fault is not None and fault.kind == "drop":
            body = body[: len(body) // 2]  # then the connection closes: the client sees a cut
        view = memoryview(body)
        for offset in range(0, len(view), 1 << 20):
            chunk = view[offset : offset + (1 << 20)]
            try:
                handler.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return
            with self._lock:
                self.bytes_sent += len(chunk)
        if fault is not None and fault.kind == "drop":
            handler.close_connection = True

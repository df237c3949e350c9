#!/usr/bin/env python3
"""PyPI's vLLM release wheels on loopback, for the cold-cache run on the GPU machine (issue 39,
items 5-6), which reaches no index and cannot hold the ten 250-315 MB wheels.

    heads WHEEL... --out DIR           here: what a member fetch reads of each wheel, minus the
                                       swap-set member's compressed bytes (made again there)
    build --heads DIR --so-dir D --listing F --out HOST [--layout sparse|padded]
                                       there: the wheels the index serves, from the heads and the
                                       carried extension files (found in D by name and CRC-32)
    serve --dir HOST [--rate-mb-s 50] [--port-file F] [--log F]
                                       there: the simple index (PEP 691 JSON, PEP 503 HTML) and
                                       the files, single byte ranges, one shared link of that rate

Layouts (say which one ran; both keep the real file names and the saved PyPI listing):
- ``sparse``: each wheel at its real size, byte for byte PyPI's in every range a member fetch
  reads (the end records, the central directory, the swap-set member's local header and
  compressed data; also the dist-info's small files); the rest is a hole that reads as zeros,
  so a member read there fails its CRC. The listing keeps PyPI's sha256, so a client that
  downloads the whole wheel and checks it fails, as it should: this layout is for a release
  source that fetches the members by range.
- ``padded``: a real zip under the real name holding the real swap-set member and the
  dist-info's small files plus a stored run of zeros that brings it to the real wheel's size,
  so a whole-wheel download moves as many bytes as from PyPI; listed with its own sha256 (the
  run then cannot prove these are PyPI's bytes beyond the member's CRC and the extension's
  sha256 the so step checked).

The member's compressed bytes are not carried: zlib at level 6 (what the wheels were written
with) makes them again from the extension, checked against their sha256 from PyPI's wheel. A
zlib that deflates differently stops ``build`` (use ``--layout padded``). Stdlib only, plus the
repo's loopback HTTP helpers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import html
import json
import os
import struct
import sys
import threading
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

SWAP_MEMBERS = ("vllm/_C_stable_libtorch.abi3.so",)
LEVEL = 6  # zlib's default: what Python's zipfile (and so the wheels' builder) wrote
JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def _local_header(data: bytes, at: int) -> int:
    """Length of the local file header at ``at`` (30 bytes, the name and the extra field)."""
    if data[at : at + 4] != b"PK\x03\x04":
        raise ValueError(f"no local file header at {at}")
    name_len, extra_len = struct.unpack("<HH", data[at + 26 : at + 30])
    return 30 + name_len + extra_len


def _read(path: Path, start: int, end: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(start)
        return handle.read(end - start)


def heads(wheels: list[Path], out: Path, members: tuple[str, ...]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            infos = sorted(archive.infolist(), key=lambda i: i.header_offset)
            cd_offset = archive.start_dir
        size = wheel.stat().st_size
        blob = bytearray()
        spans: list[dict[str, Any]] = []
        for n, info in enumerate(infos):
            # the dist-info's small files (METADATA, WHEEL, ...) as PyPI has them; RECORD
            # (~150 KB deflated a wheel, read by no release fetch) is a hole like the rest
            keep_raw = ".dist-info/" in info.filename and not info.filename.endswith("/RECORD")
            regen = info.filename in members
            if not (keep_raw or regen):
                continue
            start = info.header_offset
            end = infos[n + 1].header_offset if n + 1 < len(infos) else cd_offset
            raw = _read(wheel, start, end)
            if regen:
                head = _local_header(raw, 0)
                data = raw[head : head + info.compress_size]
                if info.compress_type != zipfile.ZIP_DEFLATED:
                    raise SystemExit(f"{wheel.name}: {info.filename} is not deflated")
                pre, post = raw[:head], raw[head + info.compress_size :]
                spans.append({
                    "name": info.filename, "offset": start, "blob": [len(blob), len(pre)],
                    "post": [len(blob) + len(pre), len(post)],
                    "compress_size": info.compress_size, "file_size": info.file_size,
                    "crc": info.CRC, "data_sha256": hashlib.sha256(data).hexdigest(),
                })
                blob += pre + post
            else:
                spans.append({"name": info.filename, "offset": start,
                              "blob": [len(blob), len(raw)]})
                blob += raw
        tail = _read(wheel, cd_offset, size)
        meta = {
            "filename": wheel.name, "size": size, "cd_offset": cd_offset,
            "tail": [len(blob), len(tail)], "spans": spans,
        }
        blob += tail
        (out / f"{wheel.name}.bin").write_bytes(bytes(blob))
        (out / f"{wheel.name}.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{wheel.name}: {len(blob)} bytes kept of {size}")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _extensions(so_dir: Path, names: set[str]) -> dict[tuple[str, int], Path]:
    """(basename, CRC-32) -> an extension file under ``so_dir`` with that name and CRC."""
    found: dict[tuple[str, int], Path] = {}
    for path in sorted(so_dir.rglob("*.so")):
        if path.name in names and path.is_file():
            crc = 0
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 22):
                    crc = zlib.crc32(chunk, crc)
            found.setdefault((path.name, crc), path)
    return found


def _deflate(path: Path) -> bytes:
    packer = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
    parts = []
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            parts.append(packer.compress(chunk))
    parts.append(packer.flush())
    return b"".join(parts)


def _inflate_member(raw: bytes) -> bytes:
    head = _local_header(raw, 0)
    flags, method = struct.unpack("<HH", raw[6:10])
    size = struct.unpack("<I", raw[18:22])[0]
    body = raw[head : head + size] if not flags & 0x08 else raw[head:]
    if method == zipfile.ZIP_STORED:
        return body[: struct.unpack("<I", raw[22:26])[0]]
    return zlib.decompressobj(-15).decompress(body)


def build(heads_dir: Path, so_dir: Path, listing: Path, out: Path, layout: str) -> None:
    metas = [json.loads(p.read_text()) for p in sorted(heads_dir.glob("*.json"))]
    if not metas:
        raise SystemExit(f"build: no wheel heads in {heads_dir}")
    names = {Path(s["name"]).name for m in metas for s in m["spans"] if "crc" in s}
    found = _extensions(so_dir, names)
    need: dict[tuple[str, int], str] = {}
    for meta in metas:
        for span in meta["spans"]:
            if "crc" in span:
                key = (Path(span["name"]).name, span["crc"])
                if key not in found:
                    raise SystemExit(f"build: {meta['filename']}: no {key[0]} with CRC "
                                     f"{key[1]:08x} under {so_dir} (place the releases first)")
                need[key] = span["data_sha256"]
    deflated: dict[tuple[str, int], bytes] = {}
    if layout == "sparse":
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(need))) as pool:
            deflated = dict(zip(need, pool.map(lambda k: _deflate(found[k]), need), strict=True))
        for key, data in deflated.items():
            got = hashlib.sha256(data).hexdigest()
            if got != need[key]:
                raise SystemExit(
                    f"build: zlib {zlib.ZLIB_RUNTIME_VERSION} deflates {found[key]} to other "
                    f"bytes than the wheel holds (sha256 {got[:12]}..., wheel "
                    f"{need[key][:12]}...): the sparse layout cannot be byte-exact here; use "
                    "--layout padded")
        print(f"build: {len(deflated)} extensions deflated at level {LEVEL} in "
              f"{time.time() - t0:.1f} s, each byte-identical to its wheel's "
              f"(zlib {zlib.ZLIB_RUNTIME_VERSION})")
    files = out / "files"
    files.mkdir(parents=True, exist_ok=True)
    def write(meta: dict[str, Any]) -> str:
        blob = (heads_dir / f"{meta['filename']}.bin").read_bytes()
        target = files / meta["filename"]
        if layout == "sparse":
            _write_sparse(target, meta, blob, deflated)
            return ""
        return _write_padded(target, meta, blob, found)

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(metas))) as pool:
        shas = list(pool.map(write, metas))  # zlib lets go of the GIL: one wheel a core
    own_sha = {m["filename"]: sha for m, sha in zip(metas, shas, strict=True) if sha}
    for meta in metas:
        print(f"  {meta['filename']}: {(files / meta['filename']).stat().st_size} bytes")
    print(f"build: {len(metas)} wheels written in {time.time() - t0:.1f} s ({layout})")
    saved = json.loads(listing.read_text())
    index_files = []
    for item in saved["files"]:
        name = item["filename"]
        index_files.append({
            "filename": name,
            "sha256": own_sha.get(name, item.get("sha256") or ""),
            "requires_python": item.get("requires_python") or "",
            "yanked": item.get("yanked"),
            "served": (files / name).is_file(),
        })
    (out / "index.json").write_text(json.dumps(
        {"package": saved["package"], "layout": layout, "files": index_files}, indent=1))
    print(f"build: index of {len(index_files)} files ({sum(f['served'] for f in index_files)} "
          f"served) -> {out}")


def _write_sparse(target: Path, meta: dict[str, Any], blob: bytes,
                  deflated: dict[tuple[str, int], bytes]) -> None:
    part = target.with_name(target.name + ".part")
    with part.open("wb") as handle:
        handle.truncate(meta["size"])  # a hole: no disk, reads as zeros
        for span in meta["spans"]:
            start, length = span["blob"]
            handle.seek(span["offset"])
            handle.write(blob[start : start + length])
            if "crc" in span:
                handle.write(deflated[(Path(span["name"]).name, span["crc"])])
                p_start, p_len = span["post"]
                handle.write(blob[p_start : p_start + p_len])
        t_start, t_len = meta["tail"]
        handle.seek(meta["cd_offset"])
        handle.write(blob[t_start : t_start + t_len])
    os.replace(part, target)


def _write_padded(target: Path, meta: dict[str, Any], blob: bytes,
                  found: dict[tuple[str, int], Path]) -> str:
    """A real zip of the kept members plus zeros to the real size; returns its sha256."""

    def write(path: Path, pad: int) -> None:
        with zipfile.ZipFile(path, "w") as archive:
            for span in meta["spans"]:
                info = zipfile.ZipInfo(span["name"], date_time=(2026, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                with archive.open(info, "w", force_zip64=False) as dest:
                    if "crc" in span:
                        with found[(Path(span["name"]).name, span["crc"])].open("rb") as src:
                            while chunk := src.read(1 << 22):
                                dest.write(chunk)
                    else:
                        start, length = span["blob"]
                        dest.write(_inflate_member(blob[start : start + length]))
            info = zipfile.ZipInfo("bisect-padding-to-the-real-size", (2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.file_size = pad
            with archive.open(info, "w", force_zip64=False) as dest:
                zeros = bytes(1 << 22)
                left = pad
                while left:
                    dest.write(zeros[: min(left, len(zeros))])
                    left -= min(left, len(zeros))

    part = target.with_name(target.name + ".part")
    write(part, 0)
    pad = meta["size"] - part.stat().st_size
    if pad < 0:
        raise SystemExit(f"build: {target.name}: the kept members alone exceed the real size")
    write(part, pad)
    if part.stat().st_size != meta["size"]:
        raise SystemExit(f"build: {target.name}: padded to {part.stat().st_size}, "
                         f"not {meta['size']}")
    os.replace(part, target)
    return _sha256_file(target)


class Host:
    """The simple index and the files over loopback HTTP, through one link of ``rate`` B/s."""

    def __init__(self, root: Path, rate: float | None, log: Path | None) -> None:
        from bisect_tool.artifacts.testing import LoopbackHTTP

        self.root = root
        self.index = json.loads((root / "index.json").read_text())
        self.rate = rate
        self.log = log.open("a", buffering=1) if log else None
        self._lock = threading.Lock()
        self._free_at = 0.0
        self.sent = 0
        self._http = LoopbackHTTP(self._handle, head=True)

    @property
    def url(self) -> str:
        return self._http.url

    def _page(self, accept: str) -> tuple[bytes, str]:
        package = self.index["package"]
        entries = list(self.index["files"])
        if JSON_TYPE in accept:
            doc = {"meta": {"api-version": "1.1"}, "name": package, "files": [{
                "filename": f["filename"],
                "url": f"{self.url}/files/{quote(f['filename'])}",
                "hashes": {"sha256": f["sha256"]} if f["sha256"] else {},
                "requires-python": f["requires_python"] or None,
                "yanked": f["yanked"] if f["yanked"] else (f["yanked"] == ""),
            } for f in entries]}
            return json.dumps(doc).encode(), JSON_TYPE
        links = []
        for f in entries:
            href = f"{self.url}/files/{quote(f['filename'])}"
            if f["sha256"]:
                href += f"#sha256={f['sha256']}"
            attrs = f' data-requires-python="{html.escape(f["requires_python"])}"' \
                if f["requires_python"] else ""
            if f["yanked"] is not None:
                attrs += f' data-yanked="{html.escape(f["yanked"])}"'
            links.append(f'<a href="{href}"{attrs}>{html.escape(f["filename"])}</a><br/>')
        body = "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
        return body.encode(), "text/html"

    def _throttle(self, n: int) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._free_at)
            self._free_at = start + n / self.rate
            wait = self._free_at - now
        time.sleep(wait)

    def _handle(self, handler: Any) -> None:
        from bisect_tool.artifacts.testing import byte_range

        t0 = time.time()
        path = unquote(handler.path.split("?", 1)[0])
        asked = handler.headers.get("Range", "")
        package = self.index["package"]
        status, sent = 404, 0
        try:
            if path.rstrip("/") in (f"/simple/{package}", f"/{package}"):
                body, ctype = self._page(handler.headers.get("Accept", ""))
                status = 200
                handler.send_response(200)
                handler.send_header("Content-Type", ctype)
                handler.send_header("Content-Length", str(len(body)))
                handler.end_headers()
                if handler.command != "HEAD":
                    handler.wfile.write(body)
                    sent = len(body)
                return
            name = path.removeprefix("/files/")
            target = self.root / "files" / name
            if not path.startswith("/files/") or "/" in name or not target.is_file():
                handler.send_error(404)
                return
            size = target.stat().st_size
            span = byte_range(asked, size)
            if span == "unsatisfiable":
                status = 416
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{size}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            start, end = span if isinstance(span, tuple) else (0, size)
            status = 206 if isinstance(span, tuple) else 200
            handler.send_response(status)
            if status == 206:
                handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            handler.send_header("Accept-Ranges", "bytes")
            handler.send_header("Content-Type", "application/octet-stream")
            handler.send_header("Content-Length", str(end - start))
            handler.end_headers()
            if handler.command == "HEAD":
                return
            with target.open("rb") as source:
                source.seek(start)
                while sent < end - start:
                    piece = source.read(min(256 * 1024, end - start - sent))
                    if not piece:
                        break
                    self._throttle(len(piece))
                    try:
                        handler.wfile.write(piece)
                    except (BrokenPipeError, ConnectionResetError):
                        break
                    sent += len(piece)
            if sent < end - start:
                handler.close_connection = True
        finally:
            with self._lock:
                self.sent += sent
            if self.log:
                self.log.write(f"{t0:.3f}\t{time.time() - t0:.3f}\t{handler.command}\t{path}\t"
                               f"{asked or '-'}\t{status}\t{sent}\n")

    def __enter__(self) -> Host:
        self._http.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.stop()


def serve(root: Path, rate_mb_s: float, port_file: Path | None, log: Path | None,
          seconds: float) -> None:
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Host(root, rate_mb_s * 1e6 if rate_mb_s > 0 else None, log) as host:
        rate = "unthrottled" if rate_mb_s <= 0 else f"{rate_mb_s:g} MB/s shared"
        print(f"serve: {host.url}/simple/ ({root}, layout {host.index['layout']}, {rate})",
              flush=True)
        if port_file:
            tmp = port_file.with_name(port_file.name + ".part")
            tmp.write_text(host.url + "\n")
            os.replace(tmp, port_file)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait(seconds if seconds > 0 else None)
        print(f"serve: stopped; {host.sent} bytes sent", flush=True)
    if port_file:
        port_file.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("heads")
    p.add_argument("wheels", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--member", action="append", default=[],
                   help=f"a swap-set member made again there (default {SWAP_MEMBERS[0]})")
    p = sub.add_parser("build")
    p.add_argument("--heads", type=Path, required=True)
    p.add_argument("--so-dir", type=Path, required=True)
    p.add_argument("--listing", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layout", choices=("sparse", "padded"), default="sparse")
    p = sub.add_parser("serve")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--rate-mb-s", type=float, default=50.0, help="0: unthrottled")
    p.add_argument("--port-file", type=Path)
    p.add_argument("--log", type=Path)
    p.add_argument("--seconds", type=float, default=0.0, help="stop after (0: on SIGTERM)")
    args = parser.parse_args(argv)
    if args.cmd == "heads":
        heads(args.wheels, args.out, tuple(args.member) or SWAP_MEMBERS)
    elif args.cmd == "build":
        build(args.heads, args.so_dir, args.listing, args.out, args.layout)
    else:
        serve(args.dir, args.rate_mb_s, args.port_file, args.log, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

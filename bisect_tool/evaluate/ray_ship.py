"""What travels to a Ray node: a swap set's files as plain values, checked by sha256 on
arrival and placed in a node-local content-addressed cache (or, under ``[runtime]
ray_shared_cache``, only their paths and hashes)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import tempfile
from pathlib import Path

from bisect_tool.artifacts.extract import sha256_file
from bisect_tool.errors import InfrastructureError
from bisect_tool.interfaces import SwapSet
from bisect_tool.values import short


@dataclasses.dataclass(frozen=True)
class ShippedFile:
    """One swap-set file: its bytes (object store) or a path on a shared mount, and its sha256."""

    rel: str
    sha256: str
    data: bytes | None = None
    shared_path: str = ""


@dataclasses.dataclass(frozen=True)
class ShippedSwap:
    commit: str
    files: tuple[ShippedFile, ...]
    source: str = ""
    origin: str = ""


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack_swap(swap: SwapSet, shared_cache: str = "") -> ShippedSwap:
    """The swap set as plain values. Files under ``shared_cache`` travel as paths."""
    files: list[ShippedFile] = []
    shared = Path(shared_cache).resolve() if shared_cache else None
    for rel, path in sorted(swap.files.items()):
        path = Path(path)
        expected = swap.sha256.get(rel, "")
        if shared is not None and path.resolve().is_relative_to(shared):
            digest = expected or sha256_file(path)
            files.append(ShippedFile(rel, digest, shared_path=str(path.resolve())))
            continue
        data = path.read_bytes()
        digest = _sha256_bytes(data)
        if expected and digest != expected:
            # The cache verified it when it was stored; a change since is the disk, not the commit.
            raise InfrastructureError(
                f"{path} changed in the artifact cache (sha256 {digest[:12]}, expected "
                f"{short(expected)}); remove it and run `bisect resume`"
            )
        files.append(ShippedFile(rel, digest, data=data))
    return ShippedSwap(swap.commit, tuple(files), swap.source, swap.origin)


def node_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "bisect-ray-cache"


def unpack_swap(shipped: ShippedSwap, cache_dir: Path | None = None) -> SwapSet:
    """On the node: check every file's sha256 and place it in the node-local cache."""
    root = cache_dir or node_cache_dir()
    files: dict[str, Path] = {}
    for f in shipped.files:
        if f.data is None:
            path = Path(f.shared_path)
            try:
                digest = sha256_file(path)
            except OSError as exc:
                raise InfrastructureError(
                    f"shared cache file {path} unreadable on this node ({exc}); mount "
                    "[runtime] ray_shared_cache at the same path on every node"
                ) from None
            if digest != f.sha256:
                raise InfrastructureError(
                    f"shared cache file {path} has sha256 {digest[:12]} on this node, the driver "
                    f"saw {f.sha256[:12]}; the mount is stale or not shared"
                )
            files[f.rel] = path
            continue
        if _sha256_bytes(f.data) != f.sha256:
            raise InfrastructureError(
                f"{f.rel} of {shipped.commit[:12]} arrived corrupted (sha256 mismatch)"
            )
        # Content-addressed: a file already placed by an earlier lifetime is reused as is.
        dest = root / f.sha256[:2] / f.sha256 / Path(f.rel).name
        if not (dest.is_file() and dest.stat().st_size == len(f.data)):
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(f.data)
                os.chmod(tmp, 0o755)
                os.replace(tmp, dest)  # atomic: concurrent lifetimes on one node never see half
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        files[f.rel] = dest
    digests = {f.rel: f.sha256 for f in shipped.files}
    return SwapSet(shipped.commit, files, shipped.source, shipped.origin, digests)



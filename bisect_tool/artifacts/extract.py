"""Read single members out of a wheel without unpacking it.

Standard library only: ``bisect artifacts extract`` runs on the GPU machine, which lacks
gitpython, docker and tenacity. A vLLM wheel is ~300 MB (732 MB unpacked) and the swap set is one
or two files of it, so only those members are streamed out (zipfile reads the central directory
and seeks to the member), hashed on the way.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bisect_tool.errors import ArtifactUnavailable, InfrastructureError

CHUNK = 1024 * 1024
#: The most one wheel member may unpack to. vLLM's largest compiled file is
#: vllm_flash_attn/_vllm_fa2_C (~300 MB; the whole v0.26.0 wheel unpacks to 732 MB): a member
#: that claims more is a zip bomb or not a vLLM wheel (issue 38: a 4 MB zip expanded to 4 GiB).
MAX_MEMBER_BYTES = 2 * 1024**3
#: A compiled file packs 2-4x; past ``BOMB_FLOOR`` a member that packs more than this is refused.
MAX_RATIO = 100
BOMB_FLOOR = 64 * 1024**2


@dataclass(frozen=True)
class ExtractedFile:
    member: str  # path inside the wheel (= relative to site-packages)
    path: Path  # where it was written
    sha256: str
    size: int


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_failed(dest: Path, exc: OSError, size: int = 0) -> InfrastructureError:
    """A write that failed, blamed on the disk it went to, never on what was being written
    (issue 38: a full disk was reported as a damaged wheel, to be fetched again)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InfrastructureError(
            f"no space left on the disk of {dest.parent} ({exc.strerror}) while writing "
            f"{dest.name}{f' ({size:,} bytes so far)' if size else ''}; free space there, or "
            "give a folder on another disk"
        )
    return InfrastructureError(f"cannot write {dest} ({exc.strerror or exc})")


def write_hashed(source: IO[bytes], dest: Path) -> tuple[str, int]:
    """Copy a stream to ``dest`` through a temp file in the same folder, renamed only when whole.

    Returns (sha256, size). A reader error leaves nothing at ``dest`` and goes to the caller as
    it is; a write error (a full disk) is an ``InfrastructureError`` naming the disk.
    """
    digest = hashlib.sha256()
    size = 0
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    except OSError as exc:
        raise write_failed(dest, exc) from None
    tmp = Path(tmp_name)
    out = os.fdopen(fd, "wb")
    try:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            try:
                out.write(chunk)
            except OSError as exc:
                raise write_failed(dest, exc, size) from None
        try:
            out.close()
            os.replace(tmp, dest)
        except OSError as exc:
            raise write_failed(dest, exc, size) from None
    except BaseException:
        with contextlib.suppress(OSError):
            out.close()
        tmp.unlink(missing_ok=True)
        raise
    return digest.hexdigest(), size


@contextmanager
def open_wheel(wheel: Path) -> Iterator[zipfile.ZipFile]:
    """Open a wheel; not a zip, or cut short: a one-line ArtifactUnavailable."""
    try:
        archive = zipfile.ZipFile(wheel)
    except FileNotFoundError:
        raise ArtifactUnavailable(f"wheel not found: {wheel}") from None
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise ArtifactUnavailable(
            f"{wheel.name} is not a readable wheel ({exc}); delete it and fetch it again"
        ) from None
    with archive:
        yield archive


def member_info(archive: zipfile.ZipFile, member: str) -> zipfile.ZipInfo:
    """The zip entry of ``member``; a wheel without it is refused, naming similar members."""
    try:
        return archive.getinfo(member)
    except KeyError:
        near = [n for n in archive.namelist() if n.endswith(Path(member).name)][:3]
        hint = f"; similar: {', '.join(near)}" if near else ""
        raise ArtifactUnavailable(
            f"{Path(str(archive.filename)).name} has no member {member}{hint}"
        ) from None


def stream_member(archive: zipfile.ZipFile, member: str, dest: Path) -> tuple[str, int]:
    """Write one member to ``dest`` (temp + rename); checks the zip CRC. Returns (sha256, size)."""
    info = member_info(archive, member)
    name = Path(str(archive.filename)).name
    packed = max(info.compress_size, 1)
    if info.file_size > MAX_MEMBER_BYTES or (
            info.file_size > BOMB_FLOOR and info.file_size > MAX_RATIO * packed):
        raise ArtifactUnavailable(
            f"{name}: member {member} would unpack to {info.file_size:,} bytes from "
            f"{info.compress_size:,} (the most taken is {MAX_MEMBER_BYTES:,} bytes, packed at "
            f"most {MAX_RATIO}x); that is no vLLM wheel: give the release's own wheel"
        )
    try:
        with archive.open(info) as source:
            return write_hashed(source, dest)
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
        # A wheel cut short mid-member still has a readable central directory only if the cut
        # falls after it, so a CRC or short-read error here means a damaged download.
        raise ArtifactUnavailable(
            f"{name}: member {member} is damaged ({exc}); "
            "delete the wheel and fetch it again"
        ) from None


def extract_members(wheel: Path, members: Sequence[str], out_dir: Path) -> list[ExtractedFile]:
    """Extract only ``members`` of ``wheel`` under ``out_dir`` (keeping their relative paths)."""
    if not members:
        raise ArtifactUnavailable("no members to extract: give --member PATH or a recipe")
    from bisect_tool.recipes.limits import inside

    # Every name is checked before anything is written: a member such as ../../evil.so must
    # not land outside --out (zip names are untrusted input).
    targets = [inside(out_dir, member, "wheel member") for member in members]
    results: list[ExtractedFile] = []
    with open_wheel(wheel) as archive:
        for member, dest in zip(members, targets, strict=True):
            sha, size = stream_member(archive, member, dest)
            results.append(ExtractedFile(member, dest, sha, size))
    return results


def full_unzip(wheel: Path, out_dir: Path) -> None:
    """The baseline the benchmark compares with: unpack everything."""
    with open_wheel(wheel) as archive:
        archive.extractall(out_dir)


def copy_file_hashed(source: Path, dest: Path) -> tuple[str, int]:
    with source.open("rb") as handle:
        return write_hashed(handle, dest)


__all__ = [
    "ExtractedFile",
    "extract_members",
    "full_unzip",
    "open_wheel",
    "sha256_file",
    "stream_member",
    "write_hashed",
    "copy_file_hashed",
]

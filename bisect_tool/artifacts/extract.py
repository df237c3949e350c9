"""Read single members out of a wheel without unpacking it.

Standard library only: ``bisect artifacts extract`` runs on the GPU machine, which lacks
gitpython, docker and tenacity. A vLLM wheel is ~300 MB (732 MB unpacked) and the swap set is one
or two files of it, so only those members are streamed out (zipfile reads the central directory
and seeks to the member), hashed on the way.
"""

from __future__ import annotations

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

from bisect_tool.errors import ArtifactUnavailable

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ExtractedFile:
    member: str  # path inside the wheel (= relative to site-packages)
    path: Path  # where it was written
    sha256: str
    size: int


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_hashed(source: IO[bytes], dest: Path) -> tuple[str, int]:
    """Copy a stream to ``dest`` through a temp file in the same folder, renamed only when whole.

    Returns (sha256, size). A reader error leaves nothing at ``dest``.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
        os.replace(tmp, dest)
    except BaseException:
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


def stream_member(archive: zipfile.ZipFile, member: str, dest: Path) -> tuple[str, int]:
    """Write one member to ``dest`` (temp + rename); checks the zip CRC. Returns (sha256, size)."""
    try:
        info = archive.getinfo(member)
    except KeyError:
        near = [n for n in archive.namelist() if n.endswith(Path(member).name)][:3]
        hint = f"; similar: {', '.join(near)}" if near else ""
        raise ArtifactUnavailable(
            f"{Path(str(archive.filename)).name} has no member {member}{hint}"
        ) from None
    try:
        with archive.open(info) as source:
            return write_hashed(source, dest)
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
        # A wheel cut short mid-member still has a readable central directory only if the cut
        # falls after it, so a CRC or short-read error here means a damaged download.
        raise ArtifactUnavailable(
            f"{Path(str(archive.filename)).name}: member {member} is damaged ({exc}); "
            "delete the wheel and fetch it again"
        ) from None


def extract_members(wheel: Path, members: Sequence[str], out_dir: Path) -> list[ExtractedFile]:
    """Extract only ``members`` of ``wheel`` under ``out_dir`` (keeping their relative paths)."""
    if not members:
        raise ArtifactUnavailable("no members to extract: give --member PATH or a recipe")
    from bisect_tool.limits import inside

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

"""Only the bytes the answer needs: the swap-set members of a remote wheel, by HTTP range.

A vLLM wheel is 240-435 MB; the swap set of the batch-invariance recipe is one member of about
57 MB compressed (vllm-facts.md). ``RemoteWheel`` is a seekable, read-only file over HTTP Range
requests that Python's own ``zipfile`` reads:

1. the last 42 bytes (a suffix range): the end-of-central-directory record and, before it, where
   a ZIP64 locator would be; the answer's Content-Range gives the file's length;
2. the central directory, in one request (the bytes it already has are not asked again);
3. per member, one request from its local header to the next entry's (local header, name,
   extra field and compressed data), streamed into ``zipfile``, which checks the CRC and the
   sizes as it inflates.

So the bytes moved per candidate are the members' compressed size plus the central directory,
the end records and the local headers: ``MemberFetch.bytes`` says how many. A server that
answers a Range request with the whole file raises ``RangesIgnored`` on the first request,
before any of that body is read; the wheel-index source then falls back to whole wheels.
"""

from __future__ import annotations

import io
import zipfile
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool.artifacts.download import Downloader, RangeStream, fetch_range, fetch_tail
from bisect_tool.artifacts.extract import ExtractedFile, member_info, stream_member
from bisect_tool.errors import ArtifactUnavailable

#: the end-of-central-directory record (22 bytes without a comment) and the ZIP64 locator
#: (20 bytes) that zipfile looks for just before it
TAIL_BYTES = 22 + 20


class RemoteWheel(io.RawIOBase):
    """A wheel at ``url`` read through Range requests: what was fetched is kept (segments), a
    read that falls in a registered member span streams the rest of that span, any other read
    fetches exactly the bytes it lacks. Only forward streaming: ``zipfile`` reads a member in
    order."""

    def __init__(self, downloader: Downloader, url: str) -> None:
        super().__init__()
        self.downloader = downloader
        self.url = url
        self.name = url.rsplit("/", 1)[-1]
        tail, self.size = fetch_tail(downloader, url, TAIL_BYTES)
        self._segments: dict[int, bytes] = {self.size - len(tail): tail}
        self._starts: list[int] = [self.size - len(tail)]
        self._spans: list[tuple[int, int]] = []  # (start, end) of the members to stream
        self._stream: RangeStream | None = None
        self._pos = 0

    # --- what zipfile asks of a file ------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        position = base + offset
        if position < 0:
            raise OSError(22, "negative seek position")
        self._pos = position
        return position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._pos < self.size:
            data = self._next(len(view) - done)
            if not data:
                break
            view[done : done + len(data)] = data
            done += len(data)
            self._pos += len(data)
        return done

    def close(self) -> None:
        self._end_stream()
        super().close()

    # --- where the bytes come from --------------------------------------------------------
    def stream_spans(self, spans: Sequence[tuple[int, int]]) -> None:
        """Reads inside these ``[start, end)`` spans stream to the span's end in one request."""
        self._spans = sorted(spans)

    def _cached(self, n: int) -> bytes:
        i = bisect_right(self._starts, self._pos) - 1
        if i < 0:
            return b""
        start = self._starts[i]
        data = self._segments[start]
        offset = self._pos - start
        return data[offset : offset + n] if offset < len(data) else b""

    def _span(self) -> tuple[int, int] | None:
        for start, end in self._spans:
            if start <= self._pos < end:
                return start, end
        return None

    def _end_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _next(self, n: int) -> bytes:
        cached = self._cached(n)
        if cached:
            return cached
        if self._stream is not None and self._stream.pos == self._pos:
            data = self._stream.read(n)
            if data:
                return data
        self._end_stream()
        span = self._span()
        if span is not None:
            self._stream = RangeStream(self.downloader, self.url, self._pos, span[1])
            return self._stream.read(n)
        # Exactly what is missing, up to the next bytes already had (the central directory
        # read finds its last 20 bytes fetched with the end record).
        i = bisect_right(self._starts, self._pos)
        stop = min(self._pos + n, self._starts[i] if i < len(self._starts) else self.size)
        data = fetch_range(self.downloader, self.url, self._pos, stop)
        self._segments[self._pos] = data
        self._starts.insert(i, self._pos)
        return data


@dataclass(frozen=True)
class CentralDirectory:
    """What one wheel's central directory says about the swap set, read without its members."""

    url: str
    wheel_size: int
    directory_size: int  # the central directory and the end records
    members: dict[str, int]  # swap-set member -> compressed size
    spans: dict[str, int]  # swap-set member -> bytes of its local record (header + data)

    @property
    def fetch_bytes(self) -> int:
        """What a member fetch of this wheel moves: the members' local records (their
        compressed data and local headers), the central directory and the end records."""
        return sum(self.spans.values()) + self.directory_size


def _spans(archive: zipfile.ZipFile, members: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Each member's local record ``[header offset, next entry's offset)``; the last entry's
    record ends where the central directory starts."""
    offsets = sorted({info.header_offset for info in archive.infolist()})
    start_dir = int(getattr(archive, "start_dir", 0)) or None
    spans: dict[str, tuple[int, int]] = {}
    for member in members:
        info = member_info(archive, member)
        i = bisect_right(offsets, info.header_offset)
        end = offsets[i] if i < len(offsets) else start_dir
        if end is None:
            end = info.header_offset + 30 + len(info.orig_filename.encode()) + 65535 + \
                info.compress_size
        spans[member] = (info.header_offset, end)
    return spans


def _open(remote: RemoteWheel) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(remote)
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise ArtifactUnavailable(
            f"{remote.name} is not a readable wheel ({exc}); the index serves a damaged file"
        ) from None


def read_directory(downloader: Downloader, url: str, members: Sequence[str]) -> CentralDirectory:
    """The central directory of the wheel at ``url`` (two small requests), for `bisect plan`'s
    byte estimate. Raises ``RangesIgnored`` where the server serves no ranges."""
    with RemoteWheel(downloader, url) as remote, _open(remote) as archive:
        spans = _spans(archive, members)
        return CentralDirectory(
            url=url,
            wheel_size=remote.size,
            directory_size=remote.size - int(archive.start_dir),
            members={m: archive.getinfo(m).compress_size for m in members},
            spans={m: end - start for m, (start, end) in spans.items()},
        )


@dataclass(frozen=True)
class MemberFetch:
    files: tuple[ExtractedFile, ...]
    wheel_size: int
    bytes: int  # received over the network for this wheel
    requests: int


def fetch_members(
    downloader: Downloader, url: str, members: Sequence[str], out_dir: Path
) -> MemberFetch:
    """Write ``members`` of the remote wheel under ``out_dir`` (at their paths in the wheel),
    hashed on the way; zipfile checks each one's CRC-32 and size. Raises ``RangesIgnored``
    (first request, nothing read) where the server serves no ranges."""
    from bisect_tool.recipes.limits import inside

    targets = [inside(out_dir, member, "wheel member") for member in members]
    # Its own counts (added to the parent's too): a lookahead fetch may run beside this one.
    own = downloader.with_policy(downloader.retry)
    results: list[ExtractedFile] = []
    with RemoteWheel(own, url) as remote, _open(remote) as archive:
        remote.stream_spans(list(_spans(archive, members).values()))
        for member, dest in zip(members, targets, strict=True):
            sha, size = stream_member(archive, member, dest)
            results.append(ExtractedFile(member, dest, sha, size))
        size = remote.size
    return MemberFetch(tuple(results), size, own.bytes_received, own.requests)

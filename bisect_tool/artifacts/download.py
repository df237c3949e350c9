"""Streamed, resumable, verified downloads over an injected ``httpx.Client``.

- A dropped connection resumes from the partial file with an HTTP Range request.
- Connect/read errors, 5xx and 429 are retried (tenacity) with exponential waits; a 429/503's
  Retry-After is honoured up to a cap. A 404 is never retried: the artifact does not exist.
- The file is written to ``<dest>.part`` and renamed only when whole and its sha256 matches.
- Every request has an overall deadline, not only a read timeout: a server that trickles a byte
  a second answers each read in time and would otherwise hold `plan` or `start --releases` for
  hours (issue 38). A small request (a page, metadata.json) has ``deadline_s``; a body of known
  length has ``DEADLINE_BASE_S`` plus its length at ``MIN_RATE_BPS``.
- ``RangeStream`` reads a byte range of a file (the swap-set members of a remote wheel,
  ``bisect_tool.artifacts.members``); a server that answers a Range request with the whole file
  (200) raises ``RangesIgnored``.
"""

from __future__ import annotations

import email.utils
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bisect_tool.artifacts.extract import sha256_file
from bisect_tool.errors import ArtifactUnavailable


class NotFound(ArtifactUnavailable):
    """The server has no such file (404/410): the source simply does not have this commit."""


class GaveUp(ArtifactUnavailable):
    """Transient failures (no connection, DNS, timeouts, 5xx, 429) outlasted the retry policy:
    the server could not be reached, or kept failing. Callers that can work offline (the
    release listing falls back to its cache) tell this apart from a definite answer."""


class RangesIgnored(ArtifactUnavailable):
    """The server answered a Range request with the whole file (200, not 206): it does not serve
    byte ranges. ``size`` is the file's length when the server said it (Content-Length)."""

    def __init__(self, message: str, size: int | None = None) -> None:
        super().__init__(message)
        self.size = size


class _Transient(Exception):
    """A failure worth another attempt (5xx, 429, dropped connection)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    wait_initial_s: float = 1.0
    wait_max_s: float = 30.0
    retry_after_cap_s: float = 60.0  # a server asking for an hour would stall the bisect
    sleep: Callable[[float], None] = time.sleep  # injected by tests to keep waits tiny


#: the overall deadline of one small request (an index page, a metadata.json)
DEFAULT_DEADLINE_S = 60.0
#: a body of known length: this much time, plus its length at the slowest rate taken as alive
DEADLINE_BASE_S = 60.0
MIN_RATE_BPS = 100_000


def body_deadline(length: int | None) -> float | None:
    """The overall deadline of a body of ``length`` bytes (None: its length is not known)."""
    return None if length is None else DEADLINE_BASE_S + length / MIN_RATE_BPS


class _Clock:
    """One request's overall deadline: ``check`` after each chunk raises once it has passed."""

    def __init__(self, url: str, seconds: float | None) -> None:
        self.url = url
        self.seconds = seconds
        self.start = time.monotonic()

    def extend(self, seconds: float | None) -> None:
        """Replace the deadline (counted from the start) once the body's length is known."""
        self.seconds = seconds

    def check(self) -> None:
        if self.seconds is not None and time.monotonic() - self.start > self.seconds:
            raise _Transient(
                f"{self.url} took longer than its deadline of {self.seconds:.0f} s "
                "(the server sends too slowly)"
            )


def _length(response: httpx.Response) -> int | None:
    try:
        return int(response.headers["content-length"])
    except (KeyError, ValueError):
        return None


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time()) if when else None


class Downloader:
    """One per provider; counts the bytes it received (``bytes_received``)."""

    def __init__(
        self,
        client: httpx.Client,
        retry: RetryPolicy | None = None,
        *,
        timeout: httpx.Timeout | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> None:
        self.client = client
        self.retry = retry or RetryPolicy()
        self.timeout = timeout  # None: the client's own
        self.deadline_s = deadline_s  # of each small request (``get``), retries apart
        self._lock = threading.Lock()
        self._parent: Downloader | None = None
        self.bytes_received = 0
        self.requests = 0

    def with_policy(
        self,
        retry: RetryPolicy,
        *,
        timeout: httpx.Timeout | None = None,
        deadline_s: float | None = None,
    ) -> Downloader:
        """The same client under another retry policy, timeout and deadline, counting its
        requests and bytes into this downloader's too: a quick look-up (an index listing that
        must not stall an offline machine) beside the patient wheel downloads."""
        child = Downloader(
            self.client, retry, timeout=timeout or self.timeout,
            deadline_s=self.deadline_s if deadline_s is None else deadline_s,
        )
        child._parent = self
        return child

    def _tally(self, requests: int = 0, received: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes_received += received
        if self._parent is not None:
            self._parent._tally(requests, received)

    def _count(self, n: int) -> None:
        self._tally(received=n)

    def _run(self, what: str, attempt: Callable[[], Any]) -> Any:
        """Call ``attempt`` under the retry policy; tenacity imported here (not on GPU hosts)."""
        import tenacity

        policy = self.retry

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, _Transient) and exc.retry_after is not None:
                return min(exc.retry_after, policy.retry_after_cap_s)
            backoff = policy.wait_initial_s * 2 ** (state.attempt_number - 1)
            return float(min(backoff, policy.wait_max_s))

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Transient),
            stop=tenacity.stop_after_attempt(policy.attempts),
            wait=wait,
            sleep=policy.sleep,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _Transient as exc:
            raise GaveUp(
                f"{what}: gave up after {policy.attempts} attempts ({exc}); "
                "check the network or the index and run again"
            ) from None

    def _check(self, response: httpx.Response, url: str) -> None:
        code = response.status_code
        if code in (404, 410):
            raise NotFound(f"{url}: {code} not found")
        if code == 429 or code >= 500:
            raise _Transient(f"{code} from {url}", _retry_after(response))
        if code >= 400:
            raise ArtifactUnavailable(f"{url}: HTTP {code}")

    def _extra(self) -> dict[str, Any]:
        return {} if self.timeout is None else {"timeout": self.timeout}

    def get(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        """A small GET (index pages, metadata.json), fully read within ``deadline_s``, retried;
        404 -> NotFound."""

        def attempt() -> httpx.Response:
            self._tally(requests=1)
            clock = _Clock(url, self.deadline_s)
            try:
                with self.client.stream(
                    "GET", url, headers=headers, follow_redirects=True, **self._extra()
                ) as r:
                    self._check(r, url)
                    body = bytearray()
                    # Raw bytes, decoded once by the Response built below; the clock is checked
                    # after every chunk, so a trickle stops at the deadline.
                    for chunk in r.iter_raw():
                        body += chunk
                        self._count(len(chunk))
                        clock.check()
            except httpx.TransportError as exc:
                raise _Transient(f"{type(exc).__name__}: {exc}") from None
            return httpx.Response(
                r.status_code, headers=r.headers, content=bytes(body), request=r.request
            )

        result: httpx.Response = self._run(url, attempt)
        return result

    def download(self, url: str, dest: Path, sha256: str = "") -> Path:
        """Fetch ``url`` to ``dest``. Resumes ``dest.part`` left by a dropped connection (or by
        an earlier run); verifies ``sha256`` when given. The caller holds the commit's lock."""
        part = dest.with_name(dest.name + ".part")
        dest.parent.mkdir(parents=True, exist_ok=True)

        def attempt() -> None:
            self._tally(requests=1)
            offset = part.stat().st_size if part.exists() else 0
            # identity: Range offsets count the bytes as stored, so no transfer compression.
            headers = {"Accept-Encoding": "identity"}
            if offset:
                headers["Range"] = f"bytes={offset}-"
            clock = _Clock(url, None)
            try:
                with self.client.stream(
                    "GET", url, headers=headers, follow_redirects=True, **self._extra()
                ) as r:
                    if r.status_code == 416 and offset:
                        # The partial is as long as the file (or longer): start over.
                        part.unlink(missing_ok=True)
                        raise _Transient(f"416 for a resume of {url}", retry_after=0)
                    self._check(r, url)
                    if r.status_code == 206 and _range_start(r) != offset:
                        part.unlink(missing_ok=True)
                        raise _Transient(f"{url} resumed at the wrong offset", retry_after=0)
                    append = r.status_code == 206  # a 200 ignores the Range: start over
                    clock.extend(body_deadline(_length(r)))
                    with part.open("ab" if append else "wb") as out:
                        # iter_raw yields what arrived as it arrives: a cut keeps every byte.
                        for chunk in r.iter_raw():
                            out.write(chunk)
                            self._count(len(chunk))
                            clock.check()
            except httpx.TransportError as exc:
                # Dropped mid-body: what arrived stays in the partial; the next attempt resumes.
                raise _Transient(f"{type(exc).__name__}: {exc}") from None

        self._run(url, attempt)
        if sha256:
            got = sha256_file(part)
            if got != sha256.lower():
                part.unlink(missing_ok=True)
                raise ArtifactUnavailable(
                    f"{url}: sha256 mismatch (index says {sha256[:16]}..., got {got[:16]}...); "
                    "the download was discarded"
                )
        os.replace(part, dest)
        return dest


def _range_start(response: httpx.Response) -> int:
    value = response.headers.get("content-range", "")  # "bytes 100-199/200"
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return -1


def _content_range(response: httpx.Response) -> tuple[int, int, int | None]:
    """(first byte, last byte, total or None) of a 206's ``Content-Range: bytes a-b/n``."""
    value = response.headers.get("content-range", "")
    try:
        unit, _, spec = value.partition(" ")
        span, _, total = spec.partition("/")
        first, _, last = span.partition("-")
        if unit.strip().lower() != "bytes":
            raise ValueError(value)
        return int(first), int(last), None if total.strip() == "*" else int(total)
    except ValueError:
        raise ArtifactUnavailable(
            f"{response.url}: a 206 without a usable Content-Range ({value!r})"
        ) from None


class RangeStream:
    """Bytes ``[start, end)`` of ``url`` (``end`` None: to the end of the file), read in order
    with ``read``. One Range request; a connection dropped mid-way resumes at the next byte with
    another, as many times as the retry policy allows. A server that answers with the whole file
    (200) raises ``RangesIgnored`` before any of its body is read. ``total`` is the file's
    length from the answer's Content-Range. Close it (or use it as a context manager)."""

    def __init__(
        self, downloader: Downloader, url: str, start: int, end: int | None = None
    ) -> None:
        self.downloader = downloader
        self.url = url
        self.pos = start
        self.end = end
        self.total: int | None = None
        self._response: httpx.Response | None = None
        self._chunks: Any = None
        self._buffer = b""
        self._drops = 0
        self._clock = _Clock(url, body_deadline(None if end is None else end - start))
        self._open()

    def _open(self) -> None:
        """Request the bytes from the first one not yet had (``pos`` plus what is buffered)."""
        downloader = self.downloader
        at = self.pos + len(self._buffer)
        span = f"bytes={at}-" if self.end is None else f"bytes={at}-{self.end - 1}"

        def attempt() -> httpx.Response:
            downloader._tally(requests=1)
            # identity: the offsets count the bytes as stored, so no transfer compression.
            headers = {"Range": span, "Accept-Encoding": "identity"}
            request = downloader.client.build_request(
                "GET", self.url, headers=headers, **downloader._extra()
            )
            try:
                response = downloader.client.send(request, stream=True, follow_redirects=True)
            except httpx.TransportError as exc:
                raise _Transient(f"{type(exc).__name__}: {exc}") from None
            try:
                if response.status_code == 200:
                    raise RangesIgnored(
                        f"{self.url}: the server ignores HTTP ranges (200 to a Range request)",
                        _length(response),
                    )
                if response.status_code == 416:
                    raise ArtifactUnavailable(
                        f"{self.url}: 416, the file is shorter than byte {at}"
                    )
                downloader._check(response, self.url)
                first, _, _ = _content_range(response)
                if first != at:
                    raise _Transient(f"{self.url} answered from byte {first}, not {at}")
            except BaseException:
                response.close()
                raise
            return response

        self._response = downloader._run(self.url, attempt)
        assert self._response is not None
        self.total = _content_range(self._response)[2] if self.total is None else self.total
        self._chunks = self._response.iter_raw()

    def _left(self) -> int | None:
        return None if self.end is None else self.end - self.pos - len(self._buffer)

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the range)."""
        while len(self._buffer) < n and self._left() != 0:
            try:
                chunk = next(self._chunks, b"")
            except httpx.TransportError as exc:
                self._resume(f"{type(exc).__name__}: {exc}")
                continue
            if not chunk:
                if self.end is None:
                    break
                self._resume("the body ended early")
                continue
            self.downloader._count(len(chunk))
            self._buffer += chunk
            try:
                self._clock.check()
            except _Transient as exc:
                raise GaveUp(f"{self.url}: {exc}") from None
        left = self._left()
        if left is not None and left < 0:  # a server that sent more than asked: cut
            self._buffer = self._buffer[: len(self._buffer) + left]
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        self.pos += len(data)
        return data

    def _resume(self, why: str) -> None:
        """Reopen at the first byte not yet had (the buffered ones are kept)."""
        self._drops += 1
        if self._drops >= self.downloader.retry.attempts:
            raise GaveUp(
                f"{self.url}: gave up after {self._drops} dropped connections ({why}); "
                "check the network or the index and run again"
            )
        if self._response is not None:
            self._response.close()
        self._open()

    def close(self) -> None:
        if self._response is not None:
            self._response.close()
            self._response = None

    def __enter__(self) -> RangeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fetch_range(downloader: Downloader, url: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``url`` in one Range request (resumed if dropped)."""
    with RangeStream(downloader, url, start, end) as stream:
        data = stream.read(end - start)
    if len(data) != end - start:
        raise ArtifactUnavailable(f"{url}: bytes {start}-{end - 1} came short ({len(data)})")
    return data


def fetch_tail(downloader: Downloader, url: str, n: int) -> tuple[bytes, int]:
    """The last ``n`` bytes of ``url`` (a suffix range, ``bytes=-n``) and the file's length."""
    downloader_ = downloader

    def attempt() -> tuple[bytes, int]:
        downloader_._tally(requests=1)
        headers = {"Range": f"bytes=-{n}", "Accept-Encoding": "identity"}
        clock = _Clock(url, downloader_.deadline_s)
        try:
            with downloader_.client.stream(
                "GET", url, headers=headers, follow_redirects=True, **downloader_._extra()
            ) as r:
                if r.status_code == 200:
                    raise RangesIgnored(
                        f"{url}: the server ignores HTTP ranges (200 to a Range request)",
                        _length(r),
                    )
                downloader_._check(r, url)
                first, last, total = _content_range(r)
                body = bytearray()
                for chunk in r.iter_raw():
                    body += chunk
                    downloader_._count(len(chunk))
                    clock.check()
        except httpx.TransportError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        size = total if total is not None else last + 1
        if len(body) != last - first + 1 or last + 1 != size:
            raise _Transient(f"{url}: the suffix range came short")
        return bytes(body), size

    result: tuple[bytes, int] = downloader._run(url, attempt)
    return result

"""Streamed, resumable, verified downloads over an injected ``httpx.Client``.

- A dropped connection resumes from the partial file with an HTTP Range request.
- Connect/read errors, 5xx and 429 are retried (tenacity) with exponential waits; a 429/503's
  Retry-After is honoured up to a cap. A 404 is never retried: the artifact does not exist.
- The file is written to ``<dest>.part`` and renamed only when whole and its sha256 matches.
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
    ) -> None:
        self.client = client
        self.retry = retry or RetryPolicy()
        self.timeout = timeout  # None: the client's own
        self._lock = threading.Lock()
        self._parent: Downloader | None = None
        self.bytes_received = 0
        self.requests = 0

    def with_policy(
        self, retry: RetryPolicy, *, timeout: httpx.Timeout | None = None
    ) -> Downloader:
        """The same client under another retry policy and timeout, counting its requests and
        bytes into this downloader's too: a quick look-up (an index listing that must not stall
        an offline machine) beside the patient wheel downloads."""
        child = Downloader(self.client, retry, timeout=timeout or self.timeout)
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

    def get(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        """A small GET (index pages, metadata.json), fully read, retried; 404 -> NotFound."""

        def attempt() -> httpx.Response:
            self._tally(requests=1)
            extra: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
            try:
                response = self.client.get(url, headers=headers, follow_redirects=True, **extra)
            except httpx.TransportError as exc:
                raise _Transient(f"{type(exc).__name__}: {exc}") from None
            self._check(response, url)
            self._count(len(response.content))
            return response

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
            extra: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
            try:
                with self.client.stream(
                    "GET", url, headers=headers, follow_redirects=True, **extra
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
                    with part.open("ab" if append else "wb") as out:
                        # iter_raw yields what arrived as it arrives: a cut keeps every byte.
                        for chunk in r.iter_raw():
                            out.write(chunk)
                            self._count(len(chunk))
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

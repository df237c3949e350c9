"""The ArtifactProvider: cache first, then the recipe's sources in order; prefetch in the
background (mozregression's habit: fetch the next candidates while one is being probed)."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.artifacts.download import Downloader
from bisect_tool.artifacts.sources import Source, swap_files_in
from bisect_tool.errors import ArtifactUnavailable, BuildFailed, UsageError
from bisect_tool.interfaces import SwapSet
from bisect_tool.values import short


class CachingProvider:
    """Implements ``bisect_tool.interfaces.ArtifactProvider``. Use as a context manager (or call
    ``close``): it owns a background thread and, unless one was injected, an HTTP client."""

    def __init__(
        self,
        cache: ArtifactCache,
        swap_set: Sequence[str],
        sources: Sequence[Source],
        *,
        downloader: Downloader | None = None,
        progress: Callable[[str], None] | None = None,
        on_close: Callable[[], None] | None = None,
        package: str = "",
    ) -> None:
        if not swap_set:
            raise UsageError("the recipe's [artifacts] swap_set is empty; list the files to swap")
        self.cache = cache
        self.swap_set = tuple(swap_set)
        self.sources = list(sources)
        self.downloader = downloader
        self.progress = progress or (lambda _msg: None)
        self._on_close = on_close
        self.package = package  # release tags of a commit also find the release's cached files
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bisect-prefetch")
        self._pending: dict[str, Future[SwapSet]] = {}
        self._guard = threading.Lock()

    @property
    def bytes_downloaded(self) -> int:
        return self.downloader.bytes_received if self.downloader else 0

    # --- ArtifactProvider ------------------------------------------------------------------
    def get(self, commit: str, tags: Sequence[str] = ()) -> SwapSet:
        with self._guard:
            pending = self._pending.pop(commit, None)
        if pending is not None:
            # A prefetch failure surfaces here, for the commit it concerns, and nowhere else.
            return pending.result()
        return self._get(commit, tuple(tags))

    def prefetch(self, commits: Sequence[str], tags: Mapping[str, Sequence[str]]) -> None:
        with self._guard:
            for commit in commits:
                if commit in self._pending or self.cache.lookup(commit, self.swap_set):
                    continue
                self._pending[commit] = self._pool.submit(
                    self._get, commit, tuple(tags.get(commit, ()))
                )

    # --- the work --------------------------------------------------------------------------
    def _cached(self, commit: str, tags: tuple[str, ...]) -> SwapSet | None:
        cached = self.cache.lookup(commit, self.swap_set)
        if cached is not None or not self.package:
            return cached
        from bisect_tool.artifacts.releases import release_aliases

        # A release tag's commit: a release-level bisect (or `artifacts import --release`) may
        # have cached that release's files already; they are the same bytes.
        for alias in release_aliases(self.package, tags):
            found = self.cache.lookup(alias, self.swap_set)
            if found is not None:
                return dataclasses.replace(found, commit=commit)
        return None

    def _get(self, commit: str, tags: tuple[str, ...]) -> SwapSet:
        cached = self._cached(commit, tags)
        if cached is not None:
            return cached
        # One fetch per commit across processes: the second waits here, then finds it cached.
        with self.cache.lock(commit):
            cached = self._cached(commit, tags)
            if cached is not None:
                return cached
            reasons: list[str] = []
            build_failure: BuildFailed | None = None
            for source in self.sources:
                try:
                    return self._from(source, commit, tags)
                except BuildFailed as exc:
                    build_failure = exc
                    reasons.append(f"{source.name}: {exc.message}")
                except ArtifactUnavailable as exc:
                    reasons.append(f"{source.name}: {exc.message}")
            summary = "; ".join(reasons) if reasons else "no sources configured"
            if build_failure is not None:
                raise BuildFailed(f"no artifact for {short(commit)}: {summary}")
            raise ArtifactUnavailable(f"no artifact for {short(commit)}: {summary}")

    def _from(self, source: Source, commit: str, tags: tuple[str, ...]) -> SwapSet:
        work = Path(tempfile.mkdtemp(prefix="work-", dir=self.cache.dirs["tmp"]))
        try:
            fetched = source.fetch(commit, tags, work)
            self.progress(f"{short(commit)}: {source.name} -> {fetched.origin}")
            try:
                if fetched.kind == "wheel":
                    return self.cache.add_wheel(
                        commit,
                        fetched.path,
                        self.swap_set,
                        source=source.name,
                        origin=fetched.origin,
                        wheel_sha256=fetched.wheel_sha256,
                    )
                files = swap_files_in(fetched.path, self.swap_set)
                return self.cache.add_files(
                    commit, files, source=source.name, origin=fetched.origin
                )
            finally:
                if fetched.temporary:
                    # Only the swap-set blobs are kept (see cache.py): a damaged download is
                    # deleted too, so the next attempt starts clean.
                    fetched.path.unlink(missing_ok=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    # --- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        with self._guard:
            for future in self._pending.values():
                future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._on_close:
            self._on_close()

    def __enter__(self) -> CachingProvider:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

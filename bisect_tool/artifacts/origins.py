"""Where each candidate's swap set would come from, found without fetching or building it.

`bisect plan` asks this: the cache (looked at, not touched), then the recipe's sources in the
provider's order, each asked the way it answers cheaply: the wheel index's metadata.json (a HEAD
for the legacy wheel name), the release index's listing (fetched once for every candidate), the
recipe's local paths, and whether a source build could run at all (a build command and a clone).
Each question is asked once, with no retries: a source that cannot be reached is said so once
and not asked again, so a plan on a machine without network takes seconds, not minutes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.dirs import default_cache_dir
from bisect_tool.errors import ArtifactUnavailable
from bisect_tool.interfaces import SwapSet
from bisect_tool.recipe import ArtifactSettings

if TYPE_CHECKING:
    import httpx

    from bisect_tool.artifacts.download import Downloader
    from bisect_tool.artifacts.index import IndexFile

#: how `bisect plan` names each source
NAMES = {
    "cache": "cache",
    "wheel-index": "wheel index",
    "release": "release wheel",
    "local": "local",
    "source-build": "source build",
    "": "none",
}
#: the sources that download (no build machine), and the one that builds
DOWNLOADS = ("wheel-index", "release")
BUILD = "source-build"


@dataclass(frozen=True)
class Origin:
    """One candidate's answer: ``source`` ("cache", a source's name, or "" for none), what it
    points at (a URL, a path, or why no source has it), and the cached swap set, if any."""

    source: str
    detail: str = ""
    swap: SwapSet | None = None

    @property
    def name(self) -> str:
        return NAMES.get(self.source, self.source)


class _Unreachable(Exception):
    """The source cannot be asked at all here (no network, no clone): skip it from now on."""


def locate_all(
    settings: ArtifactSettings,
    candidates: Sequence[tuple[str, Sequence[str]]],
    repo: Path | None,
    *,
    http_client: httpx.Client | None = None,
) -> tuple[list[Origin], dict[str, str]]:
    """Each (commit, tags)'s origin, in order; and the sources that could not be asked, with
    why (said once, not per candidate)."""
    import httpx

    from bisect_tool.artifacts.download import Downloader, RetryPolicy

    root = default_cache_dir(settings.cache_dir)
    cache = ArtifactCache(root) if (root / "manifests").is_dir() else None
    owned = http_client is None
    client = http_client or httpx.Client(
        timeout=httpx.Timeout(10.0), headers={"User-Agent": "bisect-tool"}
    )
    try:
        asker = _Asker(settings, repo, Downloader(client, RetryPolicy(attempts=1)), root)
        origins = [asker.origin(cache, commit, tuple(tags)) for commit, tags in candidates]
        return origins, dict(asker.unreachable)
    finally:
        if owned:
            client.close()


class _Asker:
    def __init__(
        self, settings: ArtifactSettings, repo: Path | None, downloader: Downloader, root: Path
    ) -> None:
        self.settings = settings
        self.repo = repo
        self.downloader = downloader
        self.downloads = root / "downloads"  # named only: nothing is downloaded
        self.unreachable: dict[str, str] = {}
        self._listing: list[IndexFile] | None = None

    def origin(self, cache: ArtifactCache | None, commit: str, tags: tuple[str, ...]) -> Origin:
        cached = self._cached(cache, commit, tags)
        if cached is not None:
            return Origin("cache", cached.origin or cached.source, cached)
        reasons: list[str] = []
        for source in self.settings.sources:
            if source in self.unreachable:
                continue
            try:
                found = self._ask(source, commit, tags)
            except _Unreachable as exc:
                self.unreachable[source] = str(exc)
                continue
            except ArtifactUnavailable as exc:
                reasons.append(f"{NAMES.get(source, source)}: {exc.message}")
                continue
            return Origin(source, found)
        return Origin("", "; ".join(reasons) or "no source could be asked")

    def _cached(
        self, cache: ArtifactCache | None, commit: str, tags: tuple[str, ...]
    ) -> SwapSet | None:
        if cache is None:
            return None
        swap_set = self.settings.swap_set
        found = cache.lookup(commit, swap_set, touch=False)
        if found is not None or not self.settings.package:
            return found
        from bisect_tool.artifacts.releases import release_aliases

        for alias in release_aliases(self.settings.package, tags):
            hit = cache.lookup(alias, swap_set, touch=False)
            if hit is not None:
                return dataclasses.replace(hit, commit=commit)
        return None

    def _ask(self, source: str, commit: str, tags: tuple[str, ...]) -> str:
        from bisect_tool.artifacts.download import GaveUp

        try:
            if source == "wheel-index":
                return self._wheel_index(commit)
            if source == "release":
                return self._release(tags)
            if source == "local":
                return self._local(commit, tags)
            if source == BUILD:
                return self._build()
        except GaveUp as exc:
            raise _Unreachable(exc.message) from None
        raise ArtifactUnavailable(f"unknown source '{source}'")

    def _wheel_index(self, commit: str) -> str:
        from bisect_tool.artifacts.download import NotFound
        from bisect_tool.artifacts.sources import LEGACY_WHEEL, WheelIndexSource

        s = self.settings
        source = WheelIndexSource(
            s.wheel_index_url, s.package, s.variant, self.downloader, self.downloads
        )
        url = source.locate(commit)
        if url.endswith("/" + LEGACY_WHEEL):
            # locate names the old layout's wheel without asking: ask, with a HEAD
            import httpx

            try:
                response = self.downloader.client.head(url, follow_redirects=True)
            except httpx.TransportError as exc:
                raise _Unreachable(f"{type(exc).__name__}: {exc}") from None
            if response.status_code in (404, 410):
                raise NotFound(f"{url}: {response.status_code} not found")
            if response.status_code >= 400:
                raise ArtifactUnavailable(f"{url}: HTTP {response.status_code}")
        return url

    def _release(self, tags: tuple[str, ...]) -> str:
        from bisect_tool.artifacts.index import fetch_project_files
        from bisect_tool.artifacts.sources import ReleaseSource, pip_index_url, release_version

        if not any(release_version(t) for t in tags):
            raise ArtifactUnavailable("the commit carries no release tag")
        s = self.settings
        index = s.index_url or pip_index_url()
        if self._listing is None:
            try:
                self._listing, _ = fetch_project_files(self.downloader, index, s.package)
            except ArtifactUnavailable as exc:  # the same for every candidate: said once
                raise _Unreachable(f"the listing of {s.package} on {index}: {exc.message}") \
                    from None
        source = ReleaseSource(index, s.package, self.downloader, self.downloads)
        url, _ = source.locate(tags, self._listing)
        return url

    def _local(self, commit: str, tags: tuple[str, ...]) -> str:
        from bisect_tool.artifacts.sources import LocalSource

        path = LocalSource(self.settings.local_paths, self.settings.swap_set)._match(commit, tags)
        if path is None:
            raise ArtifactUnavailable("no local_paths entry for this commit or its tags")
        if not path.exists():
            raise ArtifactUnavailable(f"local path {path} does not exist")
        return str(path)

    def _build(self) -> str:
        s = self.settings
        if not s.build_command:
            raise _Unreachable("no build_command in the recipe's [artifacts]")
        if self.repo is None or not (self.repo / ".git").exists():
            raise _Unreachable(f"{self.repo or 'no clone'} is not a git clone; give --repo")
        return f"{s.build_executor} build: {s.build_command}"

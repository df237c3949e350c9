"""Where each candidate's swap set would come from, found without fetching or building it.

`bisect plan` asks this: the cache (looked at, not touched), then the recipe's sources in the
provider's order, each asked the way it answers cheaply: the wheel index's metadata.json (one
small request a candidate, in the variant the pinned torch loads; a HEAD for the legacy wheel
name), the release index's listing (fetched once for every candidate), the recipe's local
paths, and whether a source build could run at all (a build command and a clone). Each question
is asked once, with no retries and a short deadline: a source that cannot be reached is said so
once and not asked again, so a plan on a machine without network takes seconds, not minutes.

``estimate_fetch`` then reads one central directory (two small range requests) for the bytes
the wheel-index candidates will move: the swap-set members' compressed size plus the central
directory, the same for every candidate as far as the plan knows (an estimate but for the wheel
it read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.artifacts.sources import CommitFacts
from bisect_tool.dirs import default_cache_dir
from bisect_tool.errors import ArtifactUnavailable
from bisect_tool.interfaces import SwapSet
from bisect_tool.recipes.recipe import ArtifactSettings, RuntimeSettings

if TYPE_CHECKING:
    import httpx

    from bisect_tool.artifacts.cuda import PinnedCuda
    from bisect_tool.artifacts.download import Downloader
    from bisect_tool.artifacts.index import IndexFile
    from bisect_tool.artifacts.sources import WheelIndexSource

#: how `bisect plan` names each source
NAMES = {
    "cache": "cache",
    "wheel-index": "wheel index",
    "release": "release wheel",
    "local": "local",
    "source-build": "source build",
    "": "none",
}
#: the source that builds (the others download: no build machine)
BUILD = "source-build"


@dataclass(frozen=True)
class Origin:
    """One candidate's answer: ``source`` ("cache", a source's name, or "" for none), what it
    points at (a URL, a path, or why no source has it), and the cached swap set, if any.
    ``no_wheel``: why the wheel index has none (its ``NoWheel.kind`` and message), where it was
    asked and said so."""

    source: str
    detail: str = ""
    swap: SwapSet | None = None
    no_wheel: tuple[str, str] | None = None

    @property
    def name(self) -> str:
        return NAMES.get(self.source, self.source)


class _Unreachable(Exception):
    """The source cannot be asked at all here (no network, no clone): skip it from now on."""


#: the deadline of each of the plan's requests: a plan answers in seconds or says why not
PLAN_DEADLINE_S = 15.0


@dataclass(frozen=True)
class FetchEstimate:
    """The bytes the wheel-index candidates will move, from one wheel's central directory."""

    candidates: int  # candidates the wheel index will serve (not in the cache)
    per_candidate: int  # bytes each: members' compressed data and local headers + directory
    members: int  # of which the swap-set members' compressed size
    directory: int  # of which the central directory and the end records
    wheel_size: int  # the whole wheel that was read, for comparison
    sampled: str  # the commit whose wheel was read ("" when none was)
    whole_wheels: bool = False  # the server ignores ranges: whole wheels are fetched
    note: str = ""  # why no wheel was read, if none was

    @property
    def total(self) -> int:
        return self.candidates * self.per_candidate

    @property
    def exact(self) -> bool:
        """Measured, not estimated: only the wheel that was read is fetched."""
        return self.candidates == 1 and bool(self.sampled)


def locate_all(
    settings: ArtifactSettings,
    candidates: Sequence[tuple[str, Sequence[str]]],
    repo: Path | None,
    *,
    http_client: httpx.Client | None = None,
    runtime: RuntimeSettings | None = None,
    pinned_cuda: PinnedCuda | None = None,
    facts: Mapping[str, CommitFacts] | None = None,
    estimate: bool = False,
) -> tuple[list[Origin], dict[str, str], FetchEstimate | None]:
    """Each (commit, tags)'s origin, in order; the sources that could not be asked, with why
    (said once, not per candidate); and, with ``estimate``, the bytes the wheel-index
    candidates will move (``FetchEstimate``)."""
    import httpx

    from bisect_tool.artifacts import commit_facts
    from bisect_tool.artifacts.download import Downloader, RetryPolicy

    root = default_cache_dir(settings.cache_dir)
    cache = ArtifactCache(root) if (root / "manifests").is_dir() else None
    owned = http_client is None
    client = http_client or httpx.Client(
        timeout=httpx.Timeout(10.0), headers={"User-Agent": "bisect-tool"}
    )
    try:
        downloader = Downloader(client, RetryPolicy(attempts=1), deadline_s=PLAN_DEADLINE_S)
        known = commit_facts(repo or Path("."), facts) if repo is not None else \
            (lambda c: (facts or {}).get(c) or CommitFacts())
        asker = _Asker(settings, repo, downloader, root, runtime, pinned_cuda, known)
        origins = [asker.origin(cache, commit, tuple(tags)) for commit, tags in candidates]
        fetch = asker.estimate(candidates, origins) if estimate else None
        return origins, dict(asker.unreachable), fetch
    finally:
        if owned:
            client.close()


class _Asker:
    def __init__(
        self,
        settings: ArtifactSettings,
        repo: Path | None,
        downloader: Downloader,
        root: Path,
        runtime: RuntimeSettings | None = None,
        pinned_cuda: PinnedCuda | None = None,
        facts: Callable[[str], CommitFacts] | None = None,
    ) -> None:
        self.settings = settings
        self.repo = repo
        self.downloader = downloader
        self.downloads = root / "downloads"  # named only: nothing is downloaded
        self.unreachable: dict[str, str] = {}
        self._listing: list[IndexFile] | None = None
        self.runtime = runtime
        self.pinned_cuda = pinned_cuda
        self.facts = facts or (lambda _c: CommitFacts())
        self._wheels: WheelIndexSource | None = None

    def origin(self, cache: ArtifactCache | None, commit: str, tags: tuple[str, ...]) -> Origin:
        cached = self._cached(cache, commit, tags)
        if cached is not None:
            return Origin("cache", cached.origin or cached.source, cached)
        reasons: list[str] = []
        no_wheel: tuple[str, str] | None = None
        for source in self.settings.sources:
            if source in self.unreachable:
                continue
            try:
                found = self._ask(source, commit, tags)
            except _Unreachable as exc:
                self.unreachable[source] = str(exc)
                continue
            except ArtifactUnavailable as exc:
                from bisect_tool.artifacts.sources import NoWheel

                if source == "wheel-index":
                    kind = exc.kind if isinstance(exc, NoWheel) else NoWheel.NOT_PUBLISHED
                    no_wheel = (kind, exc.message)
                reasons.append(f"{NAMES.get(source, source)}: {exc.message}")
                continue
            return Origin(source, found, no_wheel=no_wheel)
        return Origin("", "; ".join(reasons) or "no source could be asked", no_wheel=no_wheel)

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

    def wheels(self) -> WheelIndexSource:
        """One wheel-index source for the whole plan: the pinned torch is asked once."""
        if self._wheels is None:
            from bisect_tool.artifacts.cuda import ask_pinned_cuda
            from bisect_tool.artifacts.sources import WheelIndexSource

            s = self.settings
            pinned = self.pinned_cuda
            runtime = self.runtime
            self._wheels = WheelIndexSource(
                s.wheel_index_url, s.package, s.variant, self.downloader, self.downloads,
                swap_set=s.swap_set,
                pinned=pinned or (lambda: ask_pinned_cuda(runtime)),
            )
        return self._wheels

    def _wheel_index(self, commit: str) -> str:
        source = self.wheels()
        facts = self.facts(commit)
        choice = source.locate(commit, facts)
        if choice.legacy:
            # locate names the old layout's wheel without asking: ask, with a HEAD
            import httpx

            try:
                response = self.downloader.client.head(choice.url, follow_redirects=True)
            except httpx.TransportError as exc:
                raise _Unreachable(f"{type(exc).__name__}: {exc}") from None
            if response.status_code in (404, 410):
                raise source.no_wheel(commit, facts)
            if response.status_code >= 400:
                raise ArtifactUnavailable(f"{choice.url}: HTTP {response.status_code}")
        return choice.url

    def estimate(
        self, candidates: Sequence[tuple[str, Sequence[str]]], origins: Sequence[Origin]
    ) -> FetchEstimate | None:
        """What the wheel-index candidates will move, from the first one's central directory
        (members' compressed size + local headers, and the directory itself)."""
        from bisect_tool.artifacts.download import GaveUp, RangesIgnored
        from bisect_tool.artifacts.members import read_directory

        fetched = [(c, o) for (c, _), o in zip(candidates, origins, strict=True)
                   if o.source == "wheel-index"]
        if not fetched:
            return None
        commit, first = fetched[0]
        n = len(fetched)
        try:
            directory = read_directory(self.downloader, first.detail, self.settings.swap_set)
        except RangesIgnored as exc:
            size = exc.size or 0
            return FetchEstimate(n, size, 0, 0, size, commit, whole_wheels=True,
                                 note="" if size else "the server says no length")
        except (GaveUp, ArtifactUnavailable) as exc:
            return FetchEstimate(n, 0, 0, 0, 0, "", note=exc.message)
        return FetchEstimate(
            n, directory.fetch_bytes, sum(directory.members.values()),
            directory.directory_size, directory.wheel_size, commit,
        )

    def _release(self, tags: tuple[str, ...]) -> str:
        from bisect_tool.artifacts.index import fetch_project_files
        from bisect_tool.artifacts.pipindex import pip_index_url
        from bisect_tool.artifacts.release_source import ReleaseSource, release_version

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

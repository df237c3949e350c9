"""Artifacts stage: a candidate's swap set (its compiled files), from a verified cache.

Public API (everything else in this package is internal)::

    make_provider(settings: ArtifactSettings, repo_path: Path, *, http_client=None,
                  docker_client=None, log_dir=None, progress=None, retry=None) -> CachingProvider
        CachingProvider.get(commit, tags=()) -> SwapSet        # ArtifactUnavailable/BuildFailed
        CachingProvider.prefetch(commits, tags)                 # the lookahead: bounded, replaced
                                                                # by the next call
        CachingProvider.close() / context manager; .bytes_downloaded
    ArtifactCache(root)                                         # .lookup .import_paths .entries .gc
    default_cache_dir(setting="") -> Path
    extract_members(wheel, members, out_dir) -> list[ExtractedFile]   # stdlib only
    index.fetch_project_files(downloader, index_url, package) -> (list[IndexFile], page_url)
                                             # PEP 691/503; artifacts.releases lists them

Order of work for ``get``: the cache (commits fetched, built or imported before are served from
it with no network at all), then ``settings.sources`` in order: ``wheel-index`` (vLLM's
per-commit wheels), ``release`` (the release wheel of a tagged commit from the pip-configured
index), ``local`` (``local_paths``), ``source-build`` (a git worktree built on the host or in the
Dockerfile.base builder container). When every source fails the error lists why each did.
Downloaded wheels are deleted once the swap-set members are extracted: only blobs are kept.

Module-level imports here and in ``cli``, ``cache`` and ``extract`` are stdlib/click/httpx only,
so ``bisect artifacts extract`` runs on the GPU machine (no gitpython, docker or tenacity).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.artifacts.extract import ExtractedFile, extract_members
from bisect_tool.dirs import default_cache_dir
from bisect_tool.recipe import ArtifactSettings

if TYPE_CHECKING:
    import httpx

    from bisect_tool.artifacts.download import RetryPolicy
    from bisect_tool.artifacts.provider import CachingProvider

KNOWN_SOURCES = ("wheel-index", "release", "local", "source-build")


def make_provider(
    settings: ArtifactSettings,
    repo_path: Path,
    *,
    http_client: httpx.Client | None = None,
    docker_client: Any = None,
    log_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    retry: RetryPolicy | None = None,
    session: str = "",
) -> CachingProvider:
    """The provider for a recipe's [artifacts] settings. ``http_client`` and ``docker_client``
    are used as given (and not closed); otherwise the provider makes and closes its own."""
    import httpx

    from bisect_tool.artifacts.build import SourceBuild
    from bisect_tool.artifacts.download import Downloader
    from bisect_tool.artifacts.provider import DEFAULT_LOOKAHEAD, CachingProvider
    from bisect_tool.artifacts.sources import (
        LocalSource,
        ReleaseSource,
        Source,
        WheelIndexSource,
        pip_index_url,
    )
    from bisect_tool.errors import RecipeError

    unknown = [s for s in settings.sources if s not in KNOWN_SOURCES]
    if unknown:
        raise RecipeError(
            f"unknown artifact source '{unknown[0]}'; known: {', '.join(KNOWN_SOURCES)}"
        )
    cache = ArtifactCache(default_cache_dir(settings.cache_dir))
    owned = http_client is None
    client = http_client or httpx.Client(
        timeout=httpx.Timeout(30.0, read=120.0), headers={"User-Agent": "bisect-tool"}
    )
    downloader = Downloader(client, retry)
    sources: list[Source] = []
    for name in settings.sources:
        if name == "wheel-index":
            sources.append(
                WheelIndexSource(
                    settings.wheel_index_url,
                    settings.package,
                    settings.variant,
                    downloader,
                    cache.dirs["downloads"],
                )
            )
        elif name == "release":
            sources.append(
                ReleaseSource(
                    settings.index_url or pip_index_url(),
                    settings.package,
                    downloader,
                    cache.dirs["downloads"],
                )
            )
        elif name == "local":
            sources.append(LocalSource(settings.local_paths, settings.swap_set))
        else:
            sources.append(
                SourceBuild(
                    settings,
                    Path(repo_path),
                    scratch=cache.dirs["tmp"],
                    ccache_dir=cache.dirs["ccache"],
                    log_dir=log_dir or cache.dirs["logs"],
                    docker_client=docker_client,
                    progress=progress,
                    session=session,
                )
            )
    try:
        return CachingProvider(
            cache,
            settings.swap_set,
            sources,
            downloader=downloader,
            progress=progress,
            on_close=client.close if owned else None,
            package=settings.package,
            lookahead=settings.prefetch if settings.prefetch >= 0 else DEFAULT_LOOKAHEAD,
        )
    except BaseException:
        if owned:
            client.close()
        raise


__all__ = [
    "ArtifactCache",
    "ExtractedFile",
    "default_cache_dir",
    "extract_members",
    "make_provider",
]

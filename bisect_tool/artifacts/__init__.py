"""Artifacts stage: a candidate's swap set (its compiled files), from a verified cache.

Public API (everything else in this package is internal)::

    make_provider(settings: ArtifactSettings, repo_path: Path, *, http_client=None,
                  docker_client=None, log_dir=None, progress=None, retry=None,
                  runtime=None, pinned_cuda=None, facts=None) -> CachingProvider
        CachingProvider.get(commit, tags=()) -> SwapSet        # ArtifactUnavailable/BuildFailed
        CachingProvider.prefetch(commits, tags)                 # the lookahead: bounded, replaced
                                                                # by the next call
        CachingProvider.close() / context manager; .bytes_downloaded
    ArtifactCache(root)                                         # .lookup .import_paths .entries .gc
    default_cache_dir(setting="") -> Path
    extract_members(wheel, members, out_dir) -> list[ExtractedFile]   # stdlib only
    index.fetch_project_files(downloader, index_url, package) -> (list[IndexFile], page_url)
                                             # PEP 691/503; artifacts.releases lists them

``runtime`` (the recipe's RuntimeSettings) is the pinned stack whose torch picks the CUDA
variant of vLLM's per-commit wheels (``pinned_cuda`` gives it instead: tests, the demo);
``facts`` maps a commit to ``CommitFacts`` (on the main line? committed when?), which the wheel
index uses to say why a commit has no wheel; by default the commit time is read from the clone.

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

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.artifacts.extract import ExtractedFile, extract_members
from bisect_tool.dirs import default_cache_dir
from bisect_tool.recipes.recipe import ArtifactSettings, RuntimeSettings

if TYPE_CHECKING:
    import httpx

    from bisect_tool.artifacts.cuda import PinnedCuda
    from bisect_tool.artifacts.download import RetryPolicy
    from bisect_tool.artifacts.provider import CachingProvider
    from bisect_tool.artifacts.sources import CommitFacts

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
    runtime: RuntimeSettings | None = None,
    pinned_cuda: PinnedCuda | None = None,
    facts: Mapping[str, CommitFacts] | Callable[[str], CommitFacts] | None = None,
    mainline: str = "",
) -> CachingProvider:
    """The provider for a recipe's [artifacts] settings. ``http_client`` and ``docker_client``
    are used as given (and not closed); otherwise the provider makes and closes its own."""
    import httpx

    from bisect_tool.artifacts.build import SourceBuild
    from bisect_tool.artifacts.cuda import ask_pinned_cuda
    from bisect_tool.artifacts.download import Downloader
    from bisect_tool.artifacts.pipindex import pip_index_url
    from bisect_tool.artifacts.provider import DEFAULT_LOOKAHEAD, CachingProvider
    from bisect_tool.artifacts.release_source import ReleaseSource
    from bisect_tool.artifacts.sources import LocalSource, Source, WheelIndexSource
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
                    swap_set=settings.swap_set,
                    pinned=pinned_cuda or (
                        lambda: ask_pinned_cuda(runtime, docker_client=docker_client)
                    ),
                    progress=progress,
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
            facts=commit_facts(Path(repo_path), facts, mainline),
        )
    except BaseException:
        if owned:
            client.close()
        raise


def commit_facts(
    repo: Path,
    given: Mapping[str, CommitFacts] | Callable[[str], CommitFacts] | None = None,
    mainline: str = "",
) -> Callable[[str], CommitFacts]:
    """``given``'s facts of a commit, what they lack filled in from the clone at ``repo``: its
    commit time (``git show -s --format=%ct``) and whether the main line holds it (``git
    merge-base --is-ancestor``; ``mainline`` as the recipe's ``[range] mainline`` names it,
    else the remote's main, else ``main``: vLLM publishes wheels for main's commits only,
    #16217); nothing where it is not a clone."""
    from dataclasses import replace

    from bisect_tool.artifacts.sources import CommitFacts

    known: dict[str, CommitFacts] = {}
    main_ref: list[str] = []  # resolved on first use

    def git(*args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return None

    def on_mainline(commit: str) -> bool | None:
        if not main_ref:
            from bisect_tool.range import DEFAULT_MAINLINES

            for ref in (mainline,) if mainline else DEFAULT_MAINLINES:
                done = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
                if done is not None and done.returncode == 0:
                    main_ref.append(done.stdout.strip())
                    break
            else:
                main_ref.append("")
        if not main_ref[0]:
            return None
        done = git("merge-base", "--is-ancestor", commit, main_ref[0])
        return None if done is None or done.returncode > 1 else done.returncode == 0

    def lookup(commit: str) -> CommitFacts:
        if commit in known:
            return known[commit]
        facts = given(commit) if callable(given) else (given or {}).get(commit) or CommitFacts()
        if facts.committed_at is None:
            done = git("show", "-s", "--format=%ct", commit, "--")
            if done is not None and done.returncode == 0 and done.stdout.strip().isdigit():
                facts = replace(facts, committed_at=float(done.stdout.strip()))
        if facts.on_mainline is None:
            facts = replace(facts, on_mainline=on_mainline(commit))
        known[commit] = facts
        return facts

    return lookup


__all__ = [
    "ArtifactCache",
    "ExtractedFile",
    "commit_facts",
    "default_cache_dir",
    "extract_members",
    "make_provider",
]

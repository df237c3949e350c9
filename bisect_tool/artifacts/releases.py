"""The release range: bisect over the released versions of a package, with no git clone.

``bisect start --releases --good 0.27.0 --bad 0.22.0`` lists the recipe's package on the simple
index pip uses, keeps the releases between the two ends and hands them to the search as
candidates shaped like commits: a candidate's id (``vllm-0.26.0``) stands where a commit SHA
stands elsewhere (journal, artifact cache, container names) and its tag (``v0.26.0``) is what
the release artifact source looks the wheel up by.

The listing is cached under the artifact cache (``index/<package>.json``), so a machine that
cannot reach the index still resolves the range it resolved once online; failing that, the
releases already in the artifact cache (imported or fetched before) are the listing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from bisect_tool.artifacts.download import Downloader, RetryPolicy
from bisect_tool.artifacts.index import IndexFile, project_url
from bisect_tool.artifacts.pipindex import PipIndexes, indexes_for, list_files, place_problem
from bisect_tool.artifacts.sources import wheel_rank
from bisect_tool.errors import ArtifactUnavailable, RangeError
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.values import Direction

LISTING_VERSION = 1
# The listing is one small page: two attempts with a short wait, and a short connect timeout,
# so that an offline machine falls back to the cached listing in seconds, not in the minutes
# the wheel downloads' policy may wait out.
LISTING_RETRY = RetryPolicy(attempts=2, wait_initial_s=0.5, wait_max_s=1.0, retry_after_cap_s=2.0)
LISTING_TIMEOUT = httpx.Timeout(15.0, connect=5.0)
# ... and an overall deadline per page: an index that trickles a byte a second answers every
# read in time and would hold `start --releases` for hours (issue 38)
LISTING_DEADLINE_S = 20.0

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def release_id(package: str, version: Version | str) -> str:
    """The candidate id of a release (``vllm-0.26.0``): used wherever a commit SHA is, so safe as
    a file name and in a Docker container name. The version is PEP 440-normalised first, so
    ``0.26.0-rc1`` and ``0.26.0rc1`` share one id. (An epoch ``!`` and a local ``+`` both become
    ``_``; indexes such as PyPI publish neither, so ids stay unique per release.)"""
    if isinstance(version, str):
        with contextlib.suppress(InvalidVersion):  # a name that is no version is kept as is
            version = Version(version)
    return _UNSAFE.sub("_", f"{canonicalize_name(package)}-{version}")


def parse_release_ref(ref: str) -> Version:
    """``0.26.0`` or ``v0.26.0`` (any PEP 440 version, with or without the ``v``)."""
    try:
        return Version(ref.strip())
    except InvalidVersion:
        raise RangeError(
            f"'{ref}' is not a release version; with --releases give versions such as 0.26.0 "
            "or v0.26.0"
        ) from None


def _yanked(files: Sequence[IndexFile]) -> str | None:
    """PEP 592: a release is yanked when every file of it is; the first reason given wins."""
    if not files or not all(f.is_yanked for f in files):
        return None
    return next((f.yanked for f in files if f.yanked), "")


@dataclass(frozen=True)
class Release:
    version: Version
    yanked: str | None = None  # None: not yanked; "": yanked without a reason; else the reason
    files: tuple[IndexFile, ...] = ()

    @property
    def loadable(self) -> bool:
        """Has a wheel the pinned stack can load (CPython 3.12, manylinux x86_64). A release
        listed from the artifact cache has no files: False, though its swap set is cached."""
        return any(wheel_rank(f.filename) is not None for f in self.files)

    @property
    def is_prerelease(self) -> bool:
        return self.version.is_prerelease  # includes dev releases


@dataclass(frozen=True)
class ReleaseListing:
    package: str
    index_url: str
    releases: tuple[Release, ...]  # PEP 440 ascending
    source: str  # "index", "cache" (the saved listing) or "artifact-cache" (cached swap sets)
    fetched_at: float  # when the index was read (for "artifact-cache": the newest manifest)
    offline_reason: str = ""  # why the index was not used ("" when source is "index")
    places: str = ""  # every place listed, in words, when more than index_url (pip's extras)

    def find(self, version: Version) -> Release | None:
        return next((r for r in self.releases if r.version == version), None)


def group_files(package: str, files: Iterable[IndexFile]) -> tuple[Release, ...]:
    """The releases the files make up, PEP 440 ascending. Files whose name is neither a wheel
    nor an sdist name, or that belong to another project, are skipped."""
    wanted = canonicalize_name(package)
    by_version: dict[Version, list[IndexFile]] = {}
    for file in files:
        try:
            if file.filename.endswith(".whl"):
                name, version, _, _ = parse_wheel_filename(file.filename)
            else:
                name, version = parse_sdist_filename(file.filename)
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        if name == wanted:
            # Version equality is PEP 440's: a wheel's 0.23.0 and its build-tagged rebuild
            # (-2) are one release.
            by_version.setdefault(version, []).append(file)
    return tuple(Release(v, _yanked(fs), tuple(fs)) for v, fs in sorted(by_version.items()))


def listing_path(cache_root: Path, package: str) -> Path:
    return Path(cache_root) / "index" / f"{canonicalize_name(package)}.json"


def _save(
    path: Path,
    package: str,
    index_url: str,
    page: str,
    files: Sequence[IndexFile],
    fetched_at: float,
) -> None:
    data = {
        "version": LISTING_VERSION,
        "package": package,
        "index_url": index_url,
        "page_url": page,
        "fetched_at": fetched_at,
        "files": [f.to_json() for f in files],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=1, sort_keys=True)
        # Atomic: a reader (another bisect on this cache) sees the old listing or the new one.
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load(path: Path, package: str, reason: str) -> ReleaseListing | None:
    try:
        data: Any = json.loads(path.read_text())
        files = [IndexFile.from_json(f) for f in data["files"]]
        index_url = str(data["index_url"])
        fetched_at = float(data["fetched_at"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged listing is no listing: the next fallback is tried
    return ReleaseListing(
        package, index_url, group_files(package, files), "cache", fetched_at, reason
    )


def _from_artifact_cache(
    cache_root: Path, package: str, index_url: str, reason: str
) -> ReleaseListing | None:
    """Releases whose swap set is in the artifact cache (``manifests/<release id>.json``)."""
    prefix = f"{canonicalize_name(package)}-"
    found: dict[Version, float] = {}
    for path in (Path(cache_root) / "manifests").glob(f"{prefix}*.json"):
        try:
            version = Version(path.stem[len(prefix) :])
            mtime = path.stat().st_mtime
        except (InvalidVersion, OSError):
            continue
        # The id must be this version's own: "vllm-flash-attn-1.0" is another project.
        if release_id(package, version) == path.stem:
            found[version] = max(mtime, found.get(version, 0.0))
    if not found:
        return None
    releases = tuple(Release(v) for v in sorted(found))
    return ReleaseListing(
        package, index_url, releases, "artifact-cache", max(found.values()), reason
    )


def list_releases(
    package: str,
    index_url: str,
    downloader: Downloader,
    cache_root: Path,
    places: PipIndexes | None = None,
) -> ReleaseListing:
    """Every release of ``package`` on the simple index at ``index_url`` (and, with ``places``,
    in every place pip would look: its extra indexes and find-links, merged).

    ``downloader`` lends its HTTP client (and its retry policy's ``sleep``, so tests wait for
    nothing); the listing itself runs under ``LISTING_RETRY`` and ``LISTING_TIMEOUT``. Its
    requests count into ``downloader.requests``. ``cache_root`` is the artifact cache's root.

    Online, the listing is saved to ``cache_root/index/<package>.json``. When no place can be
    reached, that saved listing is used (``source == "cache"``), else the releases in the
    artifact cache (``"artifact-cache"``), else ``RangeError``. A 404 everywhere is a definite
    answer (no such project there): ``RangeError``, no fallback. A place that cannot be read
    while others can is left out, as pip leaves it out.
    """
    index = index_url.rstrip("/")
    places = places or PipIndexes(index)
    if not places.indexes and not places.find_links:
        raise RangeError(
            f"pip's configuration says no-index and names no find-links: nowhere to list the "
            f"releases of {package}; pass --index-url URL or set PIP_FIND_LINKS"
        )
    for place in (*places.indexes, *places.find_links):
        problem = place_problem(place)
        if problem:
            # Caught here: httpx would call it a transport error, and that would read as offline.
            raise RangeError(
                f"the index URL '{place}' {problem}; set PIP_INDEX_URL or pip's index-url to "
                "one such as https://pypi.org/simple"
            )
    policy = replace(
        LISTING_RETRY,
        attempts=min(LISTING_RETRY.attempts, downloader.retry.attempts),
        sleep=downloader.retry.sleep,
    )
    quick = downloader.with_policy(policy, timeout=LISTING_TIMEOUT,
                                   deadline_s=LISTING_DEADLINE_S)
    try:
        listed = list_files(quick, places, package)
    except ArtifactUnavailable as exc:
        raise RangeError(f"cannot list the releases of {package}: {exc.message}") from None
    releases = group_files(package, listed.files)
    if not listed.unreachable:
        if not releases:
            where = project_url(index, package) if index in listed.missing else index
            raise RangeError(
                f"{where}: 404, {places.describe()} has no project '{package}'; check the "
                "recipe's [artifacts] package and the index (PIP_INDEX_URL or pip's index-url)"
            )
        now = time.time()
        path = listing_path(cache_root, package)
        with contextlib.suppress(OSError):  # a read-only cache costs the offline fallback only
            _save(path, package, index, listed.pages[0], listed.files, now)
        return ReleaseListing(package, index, releases, "index", now, places=_places(places))
    # Some place could not be read: what the others list joins the saved listing (never saved
    # itself: a partial listing must not replace a whole one).
    place, reason = listed.unreachable[0]
    reason = f"{place}: {reason}" if place != index else reason
    cached = _load(listing_path(cache_root, package), package, reason)
    if cached is not None:
        saved = {f.filename for r in cached.releases for f in r.files}
        extra = [f for f in listed.files if f.filename not in saved]
        files = [f for r in cached.releases for f in r.files] + extra
        return replace(cached, releases=group_files(package, files), places=_places(places))
    if releases:
        return ReleaseListing(package, index, releases, "index", time.time(), reason,
                              places=_places(places))
    cached = _from_artifact_cache(cache_root, package, index, reason)
    if cached is None:
        raise RangeError(
            f"cannot reach {places.describe()} and no cached listing of {package}: run once "
            "online, or `bisect artifacts import --release VERSION ...`"
        )
    return cached


def _places(places: PipIndexes) -> str:
    """The listing's places in words, when there is more than its one index."""
    return places.describe() if places != PipIndexes(places.index_url) else ""


@dataclass(frozen=True)
class ReleaseRange:
    range: CommitRange
    listing: ReleaseListing
    left_out: tuple[tuple[str, str], ...] = ()  # (version, why): "pre-release", "yanked: ..."

    def release(self, candidate_id: str) -> Release:
        """The release behind a candidate id."""
        for release in self.listing.releases:
            if release_id(self.listing.package, release.version) == candidate_id:
                return release
        raise RangeError(f"{candidate_id} is not a release of this range")


def _where(listing: ReleaseListing) -> str:
    if listing.source == "artifact-cache":
        return "in the artifact cache (the index could not be reached)"
    return f"on {listing.places or listing.index_url}"


def _nearest(listing: ReleaseListing, wanted: Version) -> list[Version]:
    """The releases just below and just above ``wanted``; pre-releases only when it is one."""
    pool = [
        r.version for r in listing.releases if wanted.is_prerelease or not r.version.is_prerelease
    ] or [r.version for r in listing.releases]
    below = [v for v in pool if v < wanted]
    above = [v for v in pool if v > wanted]
    return [*below[-1:], *above[:1]]


def _end(listing: ReleaseListing, ref: str) -> Release:
    version = parse_release_ref(ref)
    found = listing.find(version)
    if found is not None:
        return found
    if not listing.releases:
        raise RangeError(f"no release of {listing.package} is listed {_where(listing)}")
    near = ", ".join(str(v) for v in _nearest(listing, version))
    raise RangeError(
        f"'{ref}' is not a release of {listing.package} {_where(listing)}; nearest: {near}"
    )


def _why_left_out(release: Release, *, pre: bool, yanked: bool) -> str:
    reasons = []
    if release.is_prerelease and not pre:
        reasons.append("pre-release")
    if release.yanked is not None and not yanked:
        reasons.append(f"yanked: {release.yanked}" if release.yanked else "yanked")
    return "; ".join(reasons)


def resolve_release_range(
    listing: ReleaseListing,
    good_ref: str,
    bad_ref: str,
    *,
    pre: bool = False,
    yanked: bool = False,
    tag_format: str = "v{version}",
) -> ReleaseRange:
    """The releases from one end to the other, old end first, as a ``CommitRange`` whose
    candidate ids are ``release_id``s and whose tags are ``tag_format`` (what the release
    artifact source reads the version from). Pre-releases (``pre``) and yanked releases
    (``yanked``) are left out unless asked for, and listed in ``left_out``; the two ends always
    stay. Releases without a wheel the pinned stack loads stay: they are untestable, not absent.
    """
    good, bad = _end(listing, good_ref), _end(listing, bad_ref)
    if good.version == bad.version:
        raise RangeError(
            f"--good {good_ref} and --bad {bad_ref} are the same release {good.version}"
        )
    # good newer than bad: the bug was fixed in between, look for the first good release.
    if good.version > bad.version:
        direction, old, new = Direction.FIX, bad, good
    else:
        direction, old, new = Direction.REGRESSION, good, bad
    package = listing.package
    candidates: list[Candidate] = []
    left_out: list[tuple[str, str]] = []
    for release in listing.releases:
        if not old.version <= release.version <= new.version:
            continue
        is_end = release.version in (old.version, new.version)
        why = _why_left_out(release, pre=pre, yanked=yanked)
        if why and not is_end:
            left_out.append((str(release.version), why))
            continue
        subject = f"{package} {release.version}"
        if release.yanked is not None:
            subject += f" (yanked: {release.yanked})" if release.yanked else " (yanked)"
        candidates.append(
            Candidate(
                sha=release_id(package, release.version),
                subject=subject,
                pr=None,
                tags=(tag_format.format(version=release.version),),
            )
        )
    commit_range = CommitRange(
        good_ref=good_ref,
        bad_ref=bad_ref,
        good=release_id(package, good.version),
        bad=release_id(package, bad.version),
        direction=direction,
        candidates=tuple(candidates),
        paths=(),
    )
    return ReleaseRange(commit_range, listing, tuple(left_out))


def fetch_listing(package: str, index_url: str, cache_root: Path) -> ReleaseListing:
    """``list_releases`` with an HTTP client of its own, closed on return (the run owner asks
    for the listing once, before any artifact is fetched). When ``index_url`` is pip's own
    index, every place pip would look is listed (``indexes_for``)."""
    from bisect_tool.artifacts.download import Downloader

    with httpx.Client(headers={"User-Agent": "bisect-tool"}) as client:
        return list_releases(package, index_url, Downloader(client), cache_root,
                             indexes_for(index_url))


def release_aliases(package: str, tags: Iterable[str]) -> list[str]:
    """The release ids a commit's release tags stand for (``v0.26.0`` -> ``vllm-0.26.0``): a
    commit-level bisect finds the swap set a release-level one cached under that id."""
    from bisect_tool.artifacts.release_source import release_version

    found = []
    for tag in tags:
        version = release_version(tag)
        if version is not None:
            found.append(release_id(package, version))
    return found

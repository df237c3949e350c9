"""Commits that carry a release tag: the release wheel where pip would find it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from bisect_tool.artifacts.download import Downloader
from bisect_tool.artifacts.index import IndexFile, fetch_project_files
from bisect_tool.artifacts.pipindex import PipIndexes, indexes_for, list_files, local_path
from bisect_tool.artifacts.sources import (
    TARGET_ARCH,
    Fetched,
    download_name,
    target_python,
    wheel_rank,
)
from bisect_tool.errors import ArtifactUnavailable


def release_version(tag: str) -> Version | None:
    """The release a tag names (``v0.26.0`` -> 0.26.0, ``v0.11.0rc2`` -> 0.11.0rc2), None for
    tags that name none: not a PEP 440 version, or a dev or local one (no index publishes those
    as releases)."""
    try:
        version = Version(tag.removeprefix("v"))
    except InvalidVersion:
        return None
    if version.is_devrelease or version.local is not None or len(version.release) < 2:
        return None
    return version


class ReleaseSource:
    """Commits that carry a release tag (``v0.26.0``): the release wheel from the simple index
    (PEP 691 JSON, or PEP 503 HTML), sha256 from the index."""

    name = "release"

    def __init__(
        self, index_url: str, package: str, downloader: Downloader, downloads: Path
    ) -> None:
        self.index = index_url.rstrip("/")
        self.package = package
        self.downloader = downloader
        self.downloads = downloads

    def _files(self) -> list[IndexFile]:
        """Every file of the package where pip would look for it (``indexes_for``): the
        index's project page (JSON, or HTML), and the extra indexes and find-links of pip's
        configuration when the index is pip's own."""
        places = indexes_for(self.index)
        if places == PipIndexes(self.index):
            files, _ = fetch_project_files(self.downloader, self.index, self.package)
            return files
        return list(list_files(self.downloader, places, self.package).files)

    def fetch(self, commit: str, tags: Sequence[str], work: Path) -> Fetched:
        url, sha = self.locate(tags)
        path = local_path(url)
        if path is not None:  # a file:// index or a find-links folder: no download
            return Fetched("wheel", path, url, wheel_sha256=_checked(path, url, sha))
        dest = download_name(commit, url, self.downloads)
        self.downloader.download(url, dest, sha256=sha)
        return Fetched("wheel", dest, url, wheel_sha256=sha, temporary=True)

    def locate(
        self, tags: Sequence[str], files: Sequence[IndexFile] | None = None
    ) -> tuple[str, str]:
        """(URL, sha256) of the release wheel a commit's tags name, from the index's listing
        (``files``: one already fetched, as `bisect plan` passes for every candidate)."""
        # Newest release first: a commit tagged both v0.26.0rc3 and v0.26.0 is the final one.
        versions = sorted({v for t in tags if (v := release_version(t))}, reverse=True)
        if not versions:
            raise ArtifactUnavailable("the commit carries no release tag")
        wanted = canonicalize_name(self.package)
        wheels = []
        for file in self._files() if files is None else files:
            rank = wheel_rank(file.filename)
            if rank is None:
                continue
            name, version, _, _ = parse_wheel_filename(file.filename)
            if name == wanted:
                wheels.append((version, rank, file.filename, file.url, file.sha256))
        for version in versions:
            # Version equality is PEP 440's: the tag v0.26 matches a wheel of 0.26.0.
            ranked = sorted((w[1:] for w in wheels if w[0] == version), key=lambda w: w[0])
            if ranked:
                _, _, url, sha = ranked[0]
                return url, sha
        raise ArtifactUnavailable(
            f"{indexes_for(self.index).describe()} has no wheel for CPython {target_python()} on "
            f"manylinux {TARGET_ARCH} of "
            + " or ".join(f"{self.package}=={v}" for v in versions)
        )


def _checked(path: Path, url: str, sha256: str) -> str:
    """The sha256 of a local wheel, checked against the one its index published (if any)."""
    from bisect_tool.artifacts.extract import sha256_file

    try:
        got = sha256_file(path)
    except OSError as exc:
        raise ArtifactUnavailable(f"{url}: cannot be read ({exc.strerror or exc})") from None
    if sha256 and got != sha256.lower():
        raise ArtifactUnavailable(
            f"{url}: sha256 mismatch (index says {sha256[:16]}..., got {got[:16]}...)"
        )
    return got

"""Where a candidate's compiled files come from. Each source either hands back a wheel or a
folder holding the swap set, or raises ``ArtifactUnavailable`` saying why (the provider tries
the next source and, if all fail, lists every reason)."""

from __future__ import annotations

import configparser
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urljoin

from packaging import tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from bisect_tool.artifacts.download import Downloader, NotFound
from bisect_tool.artifacts.index import IndexFile, fetch_project_files
from bisect_tool.errors import ArtifactUnavailable
from bisect_tool.values import short

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# Before metadata.json existed, vLLM's per-commit folder held one wheel under a fixed name.
LEGACY_WHEEL = "vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl"

# The interpreter and C library of the pinned stack the swapped files load into: vLLM's images
# run CPython 3.12 on Ubuntu 22.04 (glibc 2.35), x86_64. The wheel is picked for that target,
# never for the machine the tool runs on (which may be a laptop without a GPU).
TARGET_PYTHON = (3, 12)
TARGET_GLIBC = (2, 35)
TARGET_ARCH = "x86_64"


def _target_platforms() -> list[str]:
    """manylinux tags the target accepts, newest glibc first (PEP 600, and the legacy aliases
    PEP 513/571/599 beside the glibc they stand for), then plain ``linux_x86_64``."""
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    platforms = []
    for minor in range(TARGET_GLIBC[1], 4, -1):
        platforms.append(f"manylinux_{TARGET_GLIBC[0]}_{minor}_{TARGET_ARCH}")
        if minor in legacy:
            platforms.append(f"{legacy[minor]}_{TARGET_ARCH}")
    return [*platforms, f"linux_{TARGET_ARCH}"]


def target_tags() -> list[tags.Tag]:
    """Every wheel tag the pinned stack can load, most preferred first (pip's order)."""
    platforms = _target_platforms()
    return [
        *tags.cpython_tags(TARGET_PYTHON, platforms=platforms),
        *tags.compatible_tags(TARGET_PYTHON, platforms=platforms),
    ]


_TAG_RANK = {tag: i for i, tag in enumerate(target_tags())}


@dataclass(frozen=True)
class Fetched:
    kind: Literal["wheel", "dir"]
    path: Path
    origin: str  # URL or path, for the manifest
    wheel_sha256: str = ""
    temporary: bool = False  # delete after extraction (downloaded wheels)


class Source(Protocol):
    name: str

    def fetch(self, commit: str, tags: Sequence[str], work: Path) -> Fetched:
        """The candidate's wheel or swap-set folder; ``work`` is scratch the caller removes."""
        ...


def _wheel_rank(filename: str) -> int | None:
    """Sort key (lower is better) of a wheel the pinned stack can load: the rank of its best
    tag among ``target_tags()``, as pip ranks them. None for a wheel it cannot load (another
    platform or Python) or a file that is not a wheel."""
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    ranks = [_TAG_RANK[t] for t in wheel_tags if t in _TAG_RANK]
    return min(ranks, default=None)


def _download_name(commit: str, url: str, cache_downloads: Path) -> Path:
    # Stable name per commit and file so a later run resumes a partial left by a crash.
    return cache_downloads / f"{short(commit)}-{url.rsplit('/', 1)[-1].replace('%2B', '+')}"


class WheelIndexSource:
    """vLLM's per-commit wheels: ``{base}/{commit}[/{variant}]/vllm/metadata.json`` whose
    entries' ``path`` is relative to that folder and already quoted (``+`` as ``%2B``); older
    commits only have ``{base}/{commit}/vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl``."""

    name = "wheel-index"

    def __init__(
        self, base_url: str, package: str, variant: str, downloader: Downloader, downloads: Path
    ) -> None:
        self.base = base_url.rstrip("/")
        self.package = package
        self.variant = variant.strip("/")
        self.downloader = downloader
        self.downloads = downloads

    def locate(self, commit: str) -> str:
        if not FULL_SHA.match(commit):
            raise ArtifactUnavailable(f"needs a full 40-hex commit, got '{commit}'")
        folder = f"{self.base}/{commit}/" + (f"{self.variant}/" if self.variant else "")
        meta_url = f"{folder}{self.package}/metadata.json"
        try:
            entries = self.downloader.get(meta_url).json()
        except ValueError:
            raise ArtifactUnavailable(f"{meta_url} is not JSON") from None
        except NotFound as missing:
            if self.variant:
                raise ArtifactUnavailable(
                    f"no variant '{self.variant}' for this commit ({missing})"
                ) from None
            # Older layout: one fixed wheel name in the commit folder. A 404 here propagates.
            return f"{self.base}/{commit}/{LEGACY_WHEEL}"
        ranked = []
        for entry in entries if isinstance(entries, list) else []:
            filename = str(entry.get("filename", ""))
            rank = _wheel_rank(filename)
            if rank is None or not entry.get("path"):
                continue
            if self.variant and (entry.get("variant") or "") not in ("", self.variant):
                continue
            ranked.append((rank, urljoin(meta_url, str(entry["path"]))))
        if not ranked:
            raise ArtifactUnavailable(
                f"{meta_url} lists no wheel for CPython {_target()} on manylinux {TARGET_ARCH}"
            )
        return min(ranked)[1]

    def fetch(self, commit: str, tags: Sequence[str], work: Path) -> Fetched:
        url = self.locate(commit)
        dest = _download_name(commit, url, self.downloads)
        # The index publishes no hashes: the wheel's own zip CRCs still catch a damaged file.
        self.downloader.download(url, dest)
        return Fetched("wheel", dest, url, temporary=True)


def pip_index_url(env: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """The index the user's pip uses: $PIP_INDEX_URL, else index-url from pip's config files
    (site-wide, user, virtualenv, then $PIP_CONFIG_FILE; later wins; [install] over [global])."""
    env = os.environ if env is None else env
    if env.get("PIP_INDEX_URL"):
        return env["PIP_INDEX_URL"]
    home = home or Path.home()
    config_file = env.get("PIP_CONFIG_FILE", "")
    if config_file == os.devnull:
        return "https://pypi.org/simple"
    xdg_config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    files = [
        Path("/etc/xdg/pip/pip.conf"),
        Path("/etc/pip.conf"),
        home / ".pip" / "pip.conf",
        xdg_config / "pip" / "pip.conf",
        Path(sys.prefix) / "pip.conf",
    ]
    if config_file:
        files.append(Path(config_file))
    found = ""
    for path in files:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path)
        except configparser.Error:
            continue
        for section in ("global", "install"):
            if parser.has_option(section, "index-url"):
                found = parser.get(section, "index-url").strip()
    return found or "https://pypi.org/simple"


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


def _target() -> str:
    return ".".join(map(str, TARGET_PYTHON))


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
        """Every file of the package on the index's project page (JSON, or HTML)."""
        files, _ = fetch_project_files(self.downloader, self.index, self.package)
        return files

    def fetch(self, commit: str, tags: Sequence[str], work: Path) -> Fetched:
        url, sha = self.locate(tags)
        dest = _download_name(commit, url, self.downloads)
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
            rank = _wheel_rank(file.filename)
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
            f"{self.index} has no wheel for CPython {_target()} on manylinux {TARGET_ARCH} of "
            + " or ".join(f"{self.package}=={v}" for v in versions)
        )


class LocalSource:
    """``local_paths``: a commit SHA prefix or a tag -> a wheel file or a folder holding the
    swap-set files (at their relative paths, or flat by file name)."""

    name = "local"

    def __init__(self, local_paths: Mapping[str, str], swap_set: Sequence[str]) -> None:
        self.paths = dict(local_paths)
        self.swap_set = tuple(swap_set)

    def _match(self, commit: str, tags: Sequence[str]) -> Path | None:
        for key, value in self.paths.items():
            if key in tags or (len(key) >= 4 and commit.startswith(key.lower())):
                return Path(value).expanduser()
        return None

    def fetch(self, commit: str, tags: Sequence[str], work: Path) -> Fetched:
        path = self._match(commit, tags)
        if path is None:
            raise ArtifactUnavailable("no local_paths entry for this commit or its tags")
        if path.is_file():
            return Fetched("wheel", path, str(path.resolve()))
        if path.is_dir():
            return Fetched("dir", path, str(path.resolve()))
        raise ArtifactUnavailable(f"local path {path} does not exist; fix [artifacts] local_paths")


def swap_files_in(folder: Path, swap_set: Sequence[str]) -> dict[str, Path]:
    """Map each swap-set path to its file in ``folder`` (nested or flat); missing -> raise."""
    found: dict[str, Path] = {}
    for rel in swap_set:
        for candidate in (folder / rel, folder / Path(rel).name):
            if candidate.is_file():
                found[rel] = candidate
                break
        else:
            raise ArtifactUnavailable(f"{folder} has no {rel}")
    return found

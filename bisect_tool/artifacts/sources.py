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
from urllib.parse import urljoin, urlsplit
from urllib.request import url2pathname

from packaging import tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from bisect_tool.artifacts.download import Downloader, GaveUp, NotFound
from bisect_tool.artifacts.index import IndexFile, fetch_project_files, parse_html
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


PYPI = "https://pypi.org/simple"


@dataclass(frozen=True)
class PipIndexes:
    """Where pip looks for a package: its index, the extra indexes, the find-links locations
    (folders of wheels, or pages of links), and whether ``no-index`` switches the indexes off."""

    index_url: str = PYPI
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False

    @property
    def indexes(self) -> tuple[str, ...]:
        return () if self.no_index else (self.index_url, *self.extra_index_urls)

    def describe(self) -> str:
        """The places in words: "https://a/simple, https://b/simple and find-links /w"."""
        places = [*self.indexes, *(f"find-links {f}" for f in self.find_links)]
        if len(places) <= 1:
            return places[0] if places else "no index (pip's no-index, and no find-links)"
        return ", ".join(places[:-1]) + f" and {places[-1]}"


_TRUE = {"y", "yes", "t", "true", "on", "1"}


def _pip_name(name: str) -> str:
    # pip's own normalisation (configuration._normalize_name): INDEX_URL, --index-url and
    # index_url all name index-url.
    return name.lower().replace("_", "-").removeprefix("--")


def _pip_files(env: Mapping[str, str], home: Path, prefix: Path) -> list[Path]:
    """pip's configuration files, in the order pip loads them (a later one wins): site-wide
    ($XDG_CONFIG_DIRS/pip/pip.conf, /etc/pip.conf), the user's (~/.pip/pip.conf, then
    $XDG_CONFIG_HOME/pip/pip.conf; skipped when $PIP_CONFIG_FILE names a file that exists), the
    environment's (sys.prefix/pip.conf), then $PIP_CONFIG_FILE. $PIP_CONFIG_FILE=/dev/null:
    none at all (pip's own rule)."""
    config_file = env.get("PIP_CONFIG_FILE")
    if config_file == os.devnull:
        return []
    dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    files = [Path(d) / "pip" / "pip.conf" for d in dirs if d] + [Path("/etc/pip.conf")]
    if not (config_file and Path(config_file).exists()):
        xdg_config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        files += [home / ".pip" / "pip.conf", xdg_config / "pip" / "pip.conf"]
    files.append(prefix / "pip.conf")
    if config_file:
        files.append(Path(config_file))
    return files


def pip_settings(
    env: Mapping[str, str] | None = None, home: Path | None = None, prefix: Path | None = None
) -> dict[str, str]:
    """What pip's configuration says for ``pip install``, as pip merges it: every file's
    [global] then [install] values (a later file wins within each), then the ``PIP_*``
    environment variables over both. Keys are pip's option names (``index-url``)."""
    env = os.environ if env is None else env
    merged: dict[str, str] = {}
    for path in _pip_files(env, home or Path.home(), prefix or Path(sys.prefix)):
        parser = configparser.RawConfigParser()
        parser.optionxform = _pip_name  # type: ignore[assignment,method-assign]
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError, OSError):
            continue  # pip stops with an error; a listing should not: the file is skipped
        for section in parser.sections():
            for key, value in parser.items(section):
                merged[f"{section}.{key}"] = value
    out: dict[str, str] = {}
    for section in ("global", "install"):
        out.update({k.split(".", 1)[1]: v for k, v in merged.items()
                    if k.split(".", 1)[0] == section})
    for key, value in env.items():
        if key.startswith("PIP_") and key not in ("PIP_VERSION", "PIP_HELP"):
            out[_pip_name(key[4:])] = value
    return out


def pip_config(
    env: Mapping[str, str] | None = None, home: Path | None = None, prefix: Path | None = None
) -> PipIndexes:
    """The indexes and find-links locations ``pip install`` would use (see ``pip_settings``)."""
    settings = pip_settings(env, home, prefix)
    return PipIndexes(
        index_url=settings.get("index-url", "").strip() or PYPI,
        extra_index_urls=tuple(settings.get("extra-index-url", "").split()),
        find_links=tuple(settings.get("find-links", "").split()),
        no_index=settings.get("no-index", "").strip().lower() in _TRUE,
    )


def pip_index_url(env: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """The index the user's pip uses ($PIP_INDEX_URL, else index-url from pip's config files,
    else PyPI): where release wheels are listed unless the recipe or --index-url names one."""
    return pip_config(env, home).index_url


def indexes_for(index_url: str) -> PipIndexes:
    """Every place pip would look when ``index_url`` is pip's own index (nobody named another:
    its extra indexes and find-links count too, as they do for ``pip install``); else the
    index that was named, alone."""
    config = pip_config()
    if index_url.rstrip("/") == config.index_url.rstrip("/"):
        return config
    return PipIndexes(index_url)


@dataclass(frozen=True)
class Listed:
    """What the places of a ``PipIndexes`` hold for one package."""

    files: tuple[IndexFile, ...]
    pages: tuple[str, ...]  # what was read: page URLs and folders
    missing: tuple[str, ...] = ()  # indexes that have no such project (404, no folder)
    unreachable: tuple[tuple[str, str], ...] = ()  # (place, why) that could not be read


def local_path(location: str) -> Path | None:
    """The local path a ``file:`` URL or a plain path names; None for an http(s) URL."""
    parts = urlsplit(location)
    if parts.scheme == "file":
        return Path(url2pathname(parts.path))
    if parts.scheme in ("http", "https"):
        return None
    return Path(location).expanduser()


def place_problem(location: str) -> str:
    """Why pip could not read ``location`` as an index or find-links place ("" if it can)."""
    parts = urlsplit(location)
    if parts.scheme in ("http", "https"):
        return "" if parts.netloc else "has no host"
    if parts.scheme == "file" or Path(location).expanduser().exists():
        return ""
    return "is not an http(s) or file:// URL, nor an existing path"


def _local_files(path: Path, page: str) -> list[IndexFile]:
    """A find-links folder (every file in it) or a local page of links (.html)."""
    if path.is_dir():
        return [IndexFile(f.name, f.resolve().as_uri()) for f in sorted(path.iterdir())
                if f.is_file()]
    if path.suffix.lower() in (".html", ".htm"):
        return parse_html(path.read_text(encoding="utf-8", errors="replace"), page)
    return [IndexFile(path.name, path.resolve().as_uri())]


def list_files(downloader: Downloader, places: PipIndexes, package: str) -> Listed:
    """Every file of ``package`` in every place pip would look, merged (PEP 503/691 pages of
    the indexes, a ``file://`` index's ``<project>/index.html``, find-links folders and
    pages). A place that cannot be read is noted, not fatal: pip goes on with the others."""
    files: list[IndexFile] = []
    pages: list[str] = []
    missing: list[str] = []
    unreachable: list[tuple[str, str]] = []
    for index in places.indexes:
        path = local_path(index)
        if path is None:
            try:
                found, page = fetch_project_files(downloader, index, package)
            except NotFound:
                missing.append(index)
                continue
            except GaveUp as exc:
                unreachable.append((index, exc.message))
                continue
            files += found
            pages.append(page)
            continue
        project = path / canonicalize_name(package)
        page_file = project / "index.html"
        if not page_file.is_file():
            missing.append(index)
            continue
        try:
            files += parse_html(page_file.read_text(encoding="utf-8", errors="replace"),
                                project.resolve().as_uri() + "/")
        except OSError as exc:
            unreachable.append((index, exc.strerror or str(exc)))
            continue
        pages.append(str(page_file))
    for link in places.find_links:
        path = local_path(link)
        try:
            if path is None:
                response = downloader.get(link, headers={"Accept": "text/html"})
                files += parse_html(response.text, str(response.url))
                pages.append(str(response.url))
            elif path.exists():
                files += _local_files(path, path.resolve().as_uri())
                pages.append(str(path))
            else:
                missing.append(link)
        except NotFound:
            missing.append(link)
        except GaveUp as exc:
            unreachable.append((link, exc.message))
        except OSError as exc:
            unreachable.append((link, exc.strerror or str(exc)))
    return Listed(tuple(files), tuple(pages), tuple(missing), tuple(unreachable))


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
            f"{indexes_for(self.index).describe()} has no wheel for CPython {_target()} on "
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

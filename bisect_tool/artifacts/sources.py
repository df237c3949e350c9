"""Where a candidate's compiled files come from. Each source either hands back a wheel or a
folder holding the swap set, or raises ``ArtifactUnavailable`` saying why (the provider tries
the next source and, if all fail, lists every reason)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urljoin, urlsplit

from packaging import tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from bisect_tool.artifacts.cuda import (
    DEFAULT_AFTER,
    DEFAULT_BEFORE,
    DEFAULT_SWITCH,
    UNKNOWN,
    PinnedCuda,
    variant_major,
)
from bisect_tool.artifacts.download import Downloader, NotFound, RangesIgnored
from bisect_tool.artifacts.extract import ExtractedFile
from bisect_tool.artifacts.index import parse_html
from bisect_tool.artifacts.members import fetch_members
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
    kind: Literal["wheel", "dir", "members"]
    path: Path
    origin: str  # URL or path, for the manifest
    wheel_sha256: str = ""
    temporary: bool = False  # delete after extraction (downloaded wheels)
    # kind "members": the swap-set files already extracted (hashed) under ``path``
    members: tuple[ExtractedFile, ...] = ()
    wheel_size: int = 0


@dataclass(frozen=True)
class CommitFacts:
    """What the range knows of a candidate that the wheel index cannot say: whether it is on the
    main line (vLLM publishes wheels for main's commits only, vLLM #16217) and when it was
    committed (a just-merged commit has none for about an hour). None: not known."""

    on_mainline: bool | None = None
    committed_at: float | None = None  # unix time (the committer date)


class Source(Protocol):
    name: str

    def fetch(self, commit: str, tags: Sequence[str], work: Path) -> Fetched:
        """The candidate's wheel or swap-set folder; ``work`` is scratch the caller removes."""
        ...


def target_python() -> str:
    """The CPython the wheels are chosen for, in words ("3.12")."""
    return ".".join(map(str, TARGET_PYTHON))


def wheel_rank(filename: str) -> int | None:
    """Sort key (lower is better) of a wheel the pinned stack can load: the rank of its best
    tag among ``target_tags()``, as pip ranks them. None for a wheel it cannot load (another
    platform or Python) or a file that is not a wheel."""
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    ranks = [_TAG_RANK[t] for t in wheel_tags if t in _TAG_RANK]
    return min(ranks, default=None)


def download_name(commit: str, url: str, cache_downloads: Path) -> Path:
    # Stable name per commit and file so a later run resumes a partial left by a crash.
    return cache_downloads / f"{short(commit)}-{url.rsplit('/', 1)[-1].replace('%2B', '+')}"


class NoWheel(ArtifactUnavailable):
    """The wheel index has no wheel of this commit the pinned stack can load; ``kind`` says
    why, for `bisect plan`'s tally: one of ``NoWheel.KINDS``."""

    NOT_ON_MAIN = "not on main"
    TOO_NEW = "too new"
    VARIANT_MISSING = "variant missing"
    WRONG_CUDA = "wrong CUDA"
    NOT_PUBLISHED = "not published"
    KINDS = (NOT_ON_MAIN, TOO_NEW, VARIANT_MISSING, WRONG_CUDA, NOT_PUBLISHED)

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


#: how long after its merge a main commit may still lack its wheel (vLLM's CI builds and
#: uploads it after the merge: "about an hour", vllm-facts.md)
WHEEL_DELAY_S = 3600.0


@dataclass(frozen=True)
class WheelChoice:
    """The wheel of a commit the pinned stack loads, and why its CUDA is taken to match."""

    url: str
    filename: str
    variant: str  # the build's CUDA variant ("" when not known)
    how: str  # where the variant was read ("the cu130 folder", "the commit's date", ...)
    legacy: bool = False  # the fixed legacy name, not listed: its existence is not yet known


def _local_variant(version: str) -> str:
    """The CUDA variant in a version's local part (``0.10.2+cu129``, ``...+g12ab.cu130``)."""
    try:
        local = Version(version).local or ""
    except InvalidVersion:
        return ""
    return next((part for part in local.split(".") if variant_major(part) is not None), "")


class WheelIndexSource:
    """vLLM's per-commit wheels (vllm-facts.md, "Where per-commit builds come from").

    The CUDA variant is chosen as vLLM's setup.py chooses it: the recipe's ``variant``, else the
    pinned torch's CUDA (``cuda.ask_pinned_cuda``); its folder
    ``{base}/{commit}/{variant}/vllm/metadata.json`` is asked first, then the default folder
    ``{base}/{commit}/vllm/metadata.json``, used only when its build's CUDA matches (read from its
    entry's variant or version, else judged by the commit's date against vLLM PR #39878, which
    made cu130 the default in April 2026). Entries' ``path`` is relative to their folder and
    already quoted (``+`` as ``%2B``). Commits from before metadata.json have only
    ``{base}/{commit}/vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl`` (built for CUDA 12).

    Only the swap-set members are fetched, by HTTP range (``members.fetch_members``); a server
    that ignores ranges gets whole wheels from then on, said once through ``progress``."""

    name = "wheel-index"

    def __init__(
        self,
        base_url: str,
        package: str,
        variant: str,
        downloader: Downloader,
        downloads: Path,
        *,
        swap_set: Sequence[str] = (),
        pinned: PinnedCuda | Callable[[], PinnedCuda] | None = None,
        progress: Callable[[str], None] | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.base = base_url.rstrip("/")
        self.package = package
        self.variant = variant.strip("/")
        self.downloader = downloader
        self.downloads = downloads
        self.swap_set = tuple(swap_set)
        self._pinned_source = pinned
        self._pinned: PinnedCuda | None = pinned if isinstance(pinned, PinnedCuda) else None
        self._lock = threading.Lock()
        self.progress = progress or (lambda _msg: None)
        self.now = now
        self.whole_wheels = False  # set once the server was seen to ignore ranges

    @property
    def legacy_name(self) -> str:
        return LEGACY_WHEEL.replace("vllm-", f"{self.package}-", 1)

    def pinned(self) -> PinnedCuda:
        """The pinned torch's CUDA, asked once (the first commit that needs it)."""
        with self._lock:
            if self._pinned is None:
                source = self._pinned_source
                self._pinned = source() if callable(source) else UNKNOWN
            return self._pinned

    def _folder(self, commit: str, variant: str) -> str:
        return f"{self.base}/{commit}/" + (f"{variant}/" if variant else "")

    def _metadata(self, commit: str, variant: str) -> tuple[list[Any], str] | None:
        """The entries of ``[variant/]vllm/metadata.json`` and its URL; None for a 404."""
        url = f"{self._folder(commit, variant)}{self.package}/metadata.json"
        try:
            entries = self.downloader.get(url).json()
        except ValueError:
            raise ArtifactUnavailable(f"{url} is not JSON") from None
        except NotFound:
            return None
        return (entries if isinstance(entries, list) else []), url

    def _pick(self, entries: list[Any], meta_url: str) -> tuple[dict[str, Any], str]:
        """The entry the pinned stack loads best (pip's tag order) and its wheel's URL."""
        ranked = []
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            filename = str(entry.get("filename", ""))
            rank = wheel_rank(filename)
            if rank is None or not entry.get("path"):
                continue
            name = entry.get("package_name")
            if name and canonicalize_name(str(name)) != canonicalize_name(self.package):
                continue
            ranked.append((rank, filename, urljoin(meta_url, str(entry["path"])), entry))
        if not ranked:
            raise ArtifactUnavailable(
                f"{meta_url} lists no wheel for CPython {target_python()} on manylinux "
                f"{TARGET_ARCH}"
            )
        _, _, url, entry = min(ranked, key=lambda r: (r[0], r[1]))
        return entry, url

    def has(self, commit: str) -> str:
        """What the commit folder holds, from its project list (``{commit}/index.html``):
        "default, cu129, cpu"; "" when that page cannot be read."""
        try:
            page = self.downloader.get(f"{self.base}/{commit}/index.html")
            links = parse_html(page.text, str(page.url))
        except ArtifactUnavailable:
            return ""
        names = [link.filename.strip("/") for link in links]
        found = ["default" for n in names if n == self.package]
        return ", ".join(found + sorted(n for n in names if n and n != self.package))

    def default_cuda(self, entry: Mapping[str, Any], facts: CommitFacts) -> tuple[str, str]:
        """The CUDA variant of the default folder's build, and where it was read: its entry's
        variant, the local part of its version or file name, else the commit's date against
        vLLM PR #39878 (cu129 before, cu130 after); ("", why) when none of them says."""
        variant = str(entry.get("variant") or "")
        if variant_major(variant) is not None:
            return variant, "its metadata entry's variant"
        for version in (str(entry.get("version") or ""), _filename_version(entry)):
            found = _local_variant(version)
            if found:
                return found, "its version's local part"
        if facts.committed_at is not None:
            when = time.strftime("%Y-%m-%d", time.gmtime(facts.committed_at))
            if facts.committed_at < DEFAULT_SWITCH:
                return DEFAULT_BEFORE, (
                    f"the commit's date, {when}: before vLLM PR #39878 made cu130 the default"
                )
            return DEFAULT_AFTER, (
                f"the commit's date, {when}: after vLLM PR #39878 made cu130 the default"
            )
        return "", "not known (no variant in its metadata and no commit date)"

    def no_wheel(self, commit: str, facts: CommitFacts) -> NoWheel:
        """Why the index has no wheel at all for ``commit`` (nothing in its folder)."""
        if facts.on_mainline is False:
            return NoWheel(
                "not on main: vLLM publishes per-commit wheels for main's commits only "
                "(vLLM #16217)", NoWheel.NOT_ON_MAIN,
            )
        if facts.committed_at is not None and self.now() - facts.committed_at < WHEEL_DELAY_S:
            minutes = max(0, int((self.now() - facts.committed_at) // 60))
            return NoWheel(
                f"committed {minutes} min ago: vLLM's wheel of a main commit appears about an "
                "hour after the merge; run again later", NoWheel.TOO_NEW,
            )
        hint = "" if facts.on_mainline else "; vLLM publishes them for main's commits only"
        return NoWheel(
            f"no wheel at {self.base}/{commit}/ (404: no metadata.json, no legacy wheel{hint})",
            NoWheel.NOT_PUBLISHED,
        )

    def locate(self, commit: str, facts: CommitFacts | None = None) -> WheelChoice:
        """The wheel of ``commit`` the pinned stack loads; ``NoWheel`` saying why there is none
        (a ``legacy`` choice is not yet known to exist: its fetch says)."""
        facts = facts or CommitFacts()
        if not FULL_SHA.match(commit):
            raise ArtifactUnavailable(f"needs a full 40-hex commit, got '{commit}'")
        pinned = self.pinned()
        if self.variant and pinned.loads(self.variant) is False:
            raise NoWheel(pinned.refusal(self.variant, "variant named by the recipe"),
                          NoWheel.WRONG_CUDA)
        wanted = self.variant or pinned.variant
        if wanted:
            found = self._metadata(commit, wanted)
            if found is not None:
                entry, url = self._pick(*found)
                return WheelChoice(url, str(entry["filename"]), wanted, f"the {wanted} folder")
        found = self._metadata(commit, "")
        if found is None:
            if pinned.major not in (None, 12):
                # Before metadata.json, one build per commit, for CUDA 12 (the legacy wheel).
                raise self._missing(commit, facts, wanted)
            return WheelChoice(f"{self.base}/{commit}/{self.legacy_name}", self.legacy_name,
                               "", "the legacy layout (CUDA 12)", legacy=True)
        entry, url = self._pick(*found)
        variant, how = self.default_cuda(entry, facts)
        if wanted and variant and not _same_cuda(variant, wanted):
            has = self.has(commit)
            listed = f"it has {has}; " if has else ""
            raise NoWheel(
                f"{pinned.refusal(variant) if pinned.version else variant + ' wheel'}: the "
                f"commit has no {wanted} build ({listed}its default build is {variant}, by "
                f"{how})",
                NoWheel.VARIANT_MISSING,
            )
        return WheelChoice(url, str(entry["filename"]), variant, f"the default folder ({how})")

    def _missing(self, commit: str, facts: CommitFacts, wanted: str) -> NoWheel:
        """No folder the pinned torch can use: no wheel at all, or only other variants."""
        has = self.has(commit)
        if not has:
            return self.no_wheel(commit, facts)
        return NoWheel(f"no {wanted} build: the commit has {has}", NoWheel.VARIANT_MISSING)

    def fetch(
        self, commit: str, tags: Sequence[str], work: Path, facts: CommitFacts | None = None
    ) -> Fetched:
        facts = facts or CommitFacts()
        choice = self.locate(commit, facts)
        try:
            if self.swap_set and not self.whole_wheels:
                try:
                    got = fetch_members(self.downloader, choice.url, self.swap_set, work)
                except RangesIgnored:
                    self.whole_wheels = True
                    self.progress(
                        f"{urlsplit(self.base).netloc} ignores HTTP range requests: fetching "
                        "whole wheels from it"
                    )
                else:
                    return Fetched("members", work, choice.url, members=got.files,
                                   wheel_size=got.wheel_size)
            dest = download_name(commit, choice.url, self.downloads)
            # The index publishes no hashes: the wheel's own zip CRCs still catch a damage.
            self.downloader.download(choice.url, dest)
        except NotFound:
            if choice.legacy:
                raise self._missing(commit, facts, "") from None
            raise
        return Fetched("wheel", dest, choice.url, temporary=True)


def _filename_version(entry: Mapping[str, Any]) -> str:
    try:
        return str(parse_wheel_filename(str(entry.get("filename", "")))[1])
    except (InvalidWheelFilename, InvalidVersion):
        return ""


def _same_cuda(have: str, want: str) -> bool:
    """Whether a build of variant ``have`` serves where ``want`` is wanted: the same variant,
    or CUDA builds of the same major version (setup.py maps majors)."""
    if have == want:
        return True
    major = variant_major(have)
    return major is not None and major == variant_major(want)


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

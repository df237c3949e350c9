"""The content-addressed artifact cache.

Layout under the root (the user cache dir, ``~/.cache/bisect`` on Linux, by default)::

    blobs/ab/ab12...      one file per sha256, read-only; shared by commits whose file is equal
    manifests/<sha>.json  per commit: where it came from, sizes, sha256 of the wheel and files;
                          its mtime is the LRU clock (touched on every hit)
    locks/                per-commit file locks (two processes fetch a commit once)
    downloads/            partial downloads (kept so a later run resumes them)
    tmp/ logs/ ccache/    extraction scratch, build logs, the compiler cache for source builds

Wheels are deleted once their swap-set members are extracted: a vLLM wheel is ~300 MB and the
swap set one ~60 MB file, so keeping wheels would fill the cap with bytes nobody reads again.

No third-party imports at module level: the GPU machine imports this without them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_tool.artifacts.extract import (
    ExtractedFile,
    copy_file_hashed,
    open_wheel,
    stream_member,
)
from bisect_tool.errors import ArtifactUnavailable, UsageError
from bisect_tool.interfaces import SwapSet
from bisect_tool.values import short

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class CachedFile:
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    commit: str
    source: str
    origin: str
    files: Mapping[str, CachedFile]
    created: float
    wheel_sha256: str = ""
    wheel_size: int = 0
    last_used: float = 0.0  # the manifest's mtime when read

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "commit": self.commit,
            "source": self.source,
            "origin": self.origin,
            "created": self.created,
            "wheel": {"sha256": self.wheel_sha256, "size": self.wheel_size},
            "files": {p: {"sha256": f.sha256, "size": f.size} for p, f in self.files.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], last_used: float = 0.0) -> Manifest:
        wheel = data.get("wheel") or {}
        return cls(
            commit=str(data["commit"]),
            source=str(data.get("source", "")),
            origin=str(data.get("origin", "")),
            files={
                str(p): CachedFile(str(f["sha256"]), int(f["size"]))
                for p, f in dict(data["files"]).items()
            },
            created=float(data.get("created", 0.0)),
            wheel_sha256=str(wheel.get("sha256", "")),
            wheel_size=int(wheel.get("size", 0)),
            last_used=last_used,
        )


@dataclass(frozen=True)
class GcResult:
    removed: tuple[str, ...] = ()  # commits evicted
    freed_bytes: int = 0
    remaining_bytes: int = 0


@dataclass
class ArtifactCache:
    root: Path
    dirs: dict[str, Path] = field(init=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root).expanduser()
        self.dirs = {
            name: self.root / name
            for name in ("blobs", "manifests", "locks", "downloads", "tmp", "logs", "ccache")
        }
        for path in self.dirs.values():
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                # Either the cache root (from --cache-dir, BISECT_CACHE_DIR or the recipe's
                # cache_dir) is a file, or it cannot be written: say which setting to change.
                is_file = isinstance(exc, FileExistsError | NotADirectoryError)
                why = "a file, not a folder" if is_file else (exc.strerror or str(exc))
                raise UsageError(
                    f"the artifact cache {self.root} cannot be used ({why}); set --cache-dir, "
                    "BISECT_CACHE_DIR or [artifacts] cache_dir to a folder you can write"
                ) from None
            if not os.access(path, os.W_OK | os.X_OK):
                raise UsageError(
                    f"the artifact cache {self.root} is not writable; set --cache-dir, "
                    "BISECT_CACHE_DIR or [artifacts] cache_dir to a folder you can write"
                )

    # --- locks ---------------------------------------------------------------------------
    @contextmanager
    def lock(self, name: str, timeout: float = -1) -> Iterator[None]:
        """An inter-process lock (filelock, imported here: a GPU machine without it falls back
        to a plain flock, which is what filelock does on Linux)."""
        path = self.dirs["locks"] / f"{name}.lock"
        try:
            from filelock import FileLock
        except ImportError:
            import fcntl

            with path.open("a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
            return
        with FileLock(str(path), timeout=timeout):
            yield

    # --- blobs ---------------------------------------------------------------------------
    def blob_path(self, sha256: str) -> Path:
        return self.dirs["blobs"] / sha256[:2] / sha256

    def _adopt(self, tmp: Path, sha256: str) -> Path:
        """Move a hashed temp file into the blob store (dedup: an equal blob is kept)."""
        dest = self.blob_path(sha256)
        if dest.exists():
            tmp.unlink(missing_ok=True)
            os.utime(dest)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp.chmod(0o444)  # blobs are shared and mounted into containers: never edited
            os.replace(tmp, dest)
        return dest

    # --- manifests -----------------------------------------------------------------------
    def _manifest_path(self, commit: str) -> Path:
        return self.dirs["manifests"] / f"{commit}.json"

    def manifest(self, commit: str) -> Manifest | None:
        path = self._manifest_path(commit)
        try:
            data = json.loads(path.read_text())
            return Manifest.from_json(data, last_used=path.stat().st_mtime)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            # A manifest we cannot read is a miss, not a crash: the commit is fetched again.
            return None

    def lookup(
        self, commit: str, swap_set: Sequence[str], *, touch: bool = True
    ) -> SwapSet | None:
        """The cached swap set of ``commit`` if every member is there; touches it (LRU) unless
        ``touch`` is false (`bisect plan` only looks)."""
        found = self.manifest(commit)
        if found is None or not swap_set or any(p not in found.files for p in swap_set):
            return None
        files: dict[str, Path] = {}
        for rel in swap_set:
            entry = found.files[rel]
            blob = self.blob_path(entry.sha256)
            try:
                if blob.stat().st_size != entry.size:
                    return None
            except FileNotFoundError:
                return None
            files[rel] = blob
        # Explicit time: the kernel stamps files with a coarse clock (ms ticks), too coarse to
        # order hits that follow each other closely.
        if touch:
            now = time.time()
            os.utime(self._manifest_path(commit), (now, now))
        return SwapSet(
            commit=commit,
            files=files,
            source=found.source,
            origin=found.origin,
            sha256={rel: found.files[rel].sha256 for rel in swap_set},
        )

    def _store(
        self,
        commit: str,
        staged: Mapping[str, tuple[Path, str, int]],
        *,
        source: str,
        origin: str,
        wheel_sha256: str = "",
        wheel_size: int = 0,
    ) -> Manifest:
        """Adopt staged temp files and write the manifest, under the cache-wide lock so that a
        concurrent gc never deletes a blob between its adoption and the manifest naming it."""
        with self.lock("_cache"):
            previous = self.manifest(commit)
            files = dict(previous.files) if previous else {}
            for rel, (tmp, sha, size) in staged.items():
                self._adopt(tmp, sha)
                files[rel] = CachedFile(sha, size)
            manifest = Manifest(
                commit=commit,
                source=source,
                origin=origin,
                files=files,
                created=time.time(),
                wheel_sha256=wheel_sha256,
                wheel_size=wheel_size,
            )
            path = self._manifest_path(commit)
            tmp_manifest = path.with_suffix(".json.tmp")
            tmp_manifest.write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=True))
            now = time.time()
            os.utime(tmp_manifest, (now, now))
            os.replace(tmp_manifest, path)
        return manifest

    def add_wheel(
        self,
        commit: str,
        wheel: Path,
        swap_set: Sequence[str],
        *,
        source: str,
        origin: str,
        wheel_sha256: str = "",
    ) -> SwapSet:
        """Extract the swap-set members of ``wheel`` into the cache for ``commit``."""
        staged: dict[str, tuple[Path, str, int]] = {}
        try:
            with open_wheel(wheel) as archive:
                for rel in swap_set:
                    tmp = self._scratch()
                    sha, size = stream_member(archive, rel, tmp)
                    staged[rel] = (tmp, sha, size)
            if not wheel_sha256:
                from bisect_tool.artifacts.extract import sha256_file

                wheel_sha256 = sha256_file(wheel)
            self._store(
                commit,
                staged,
                source=source,
                origin=origin,
                wheel_sha256=wheel_sha256,
                wheel_size=wheel.stat().st_size,
            )
        finally:
            for tmp, _, _ in staged.values():
                tmp.unlink(missing_ok=True)
        return self._must(commit, swap_set)

    def add_extracted(
        self,
        commit: str,
        files: Sequence[ExtractedFile],
        *,
        source: str,
        origin: str,
        wheel_size: int = 0,
    ) -> SwapSet:
        """Adopt swap-set files already extracted and hashed on the way (a member fetch by
        HTTP range: the wheel itself was never whole here, so no wheel sha256). The files
        move into the blob store (they must be on the cache's file system: its tmp/)."""
        staged = {f.member: (f.path, f.sha256, f.size) for f in files}
        try:
            self._store(commit, staged, source=source, origin=origin, wheel_size=wheel_size)
        finally:
            for tmp, _, _ in staged.values():
                tmp.unlink(missing_ok=True)
        return self._must(commit, [f.member for f in files])

    def add_files(
        self, commit: str, files: Mapping[str, Path], *, source: str, origin: str
    ) -> SwapSet:
        """Copy loose files (swap-set path -> file) into the cache for ``commit``."""
        staged: dict[str, tuple[Path, str, int]] = {}
        try:
            for rel, path in files.items():
                tmp = self._scratch()
                try:
                    sha, size = copy_file_hashed(path, tmp)
                except FileNotFoundError:
                    raise ArtifactUnavailable(f"{path} does not exist (for {rel})") from None
                staged[rel] = (tmp, sha, size)
            self._store(commit, staged, source=source, origin=origin)
        finally:
            for tmp, _, _ in staged.values():
                tmp.unlink(missing_ok=True)
        return self._must(commit, list(files))

    def import_paths(self, commit: str, paths: Sequence[Path], swap_set: Sequence[str]) -> SwapSet:
        """``bisect artifacts import``: one wheel, or the swap-set files given directly (matched
        to swap-set entries by file name)."""
        if not swap_set:
            raise UsageError("the swap set is empty: give --member PATH or a recipe with one")
        from bisect_tool.recipes.limits import relative_problem

        for entry in swap_set:
            if relative_problem(entry):
                raise UsageError(
                    f"swap-set entry '{entry}' {relative_problem(entry)}; give a path inside "
                    "site-packages such as vllm/_C.abi3.so"
                )
        for path in paths:
            if not path.exists():
                raise UsageError(f"{path} not found; give the path of a wheel or a swap-set file")
        if len(paths) == 1 and paths[0].suffix == ".whl":
            return self.add_wheel(
                commit, paths[0], swap_set, source="import", origin=str(paths[0].resolve())
            )
        by_name = {Path(rel).name: rel for rel in swap_set}
        chosen: dict[str, Path] = {}
        for path in paths:
            rel = by_name.get(path.name)
            if rel is None:
                raise UsageError(
                    f"{path.name} is not in the swap set ({', '.join(swap_set)}); "
                    "give a wheel or files with those names"
                )
            chosen[rel] = path
        missing = [rel for rel in swap_set if rel not in chosen]
        if missing:
            raise UsageError(f"missing swap-set files: {', '.join(missing)}; give them too")
        origin = ", ".join(str(p.resolve()) for p in paths)
        return self.add_files(commit, chosen, source="import", origin=origin)

    def _must(self, commit: str, swap_set: Sequence[str]) -> SwapSet:
        found = self.lookup(commit, swap_set)
        if found is None:  # only if someone deleted the blobs under us
            raise ArtifactUnavailable(f"cache entry of {short(commit)} vanished while writing it")
        return found

    def _scratch(self) -> Path:
        import tempfile

        fd, name = tempfile.mkstemp(dir=self.dirs["tmp"], prefix="x-")
        os.close(fd)
        return Path(name)

    # --- listing and gc ------------------------------------------------------------------
    def entries(self) -> list[Manifest]:
        """Every cached commit, most recently used first."""
        found = []
        for path in self.dirs["manifests"].glob("*.json"):
            manifest = self.manifest(path.stem)
            if manifest is not None:
                found.append(manifest)
        return sorted(found, key=lambda m: m.last_used, reverse=True)

    def _blobs(self) -> dict[str, int]:
        return {
            p.name: p.stat().st_size
            for p in self.dirs["blobs"].glob("*/*")
            if p.is_file() and not p.name.startswith(".")
        }

    def total_bytes(self) -> int:
        return sum(self._blobs().values())

    def gc(self, max_bytes: int) -> GcResult:
        """Evict least recently used commits until the blobs fit in ``max_bytes``; blobs no
        manifest names are always removed (leftovers of an eviction or a crash)."""
        with self.lock("_cache"):
            blobs = self._blobs()
            entries = sorted(self.entries(), key=lambda m: m.last_used)  # oldest first
            referenced = {f.sha256 for m in entries for f in m.files.values()}
            freed = 0
            for sha, size in blobs.items():
                if sha not in referenced:
                    self.blob_path(sha).unlink(missing_ok=True)
                    freed += size
            live = {sha: size for sha, size in blobs.items() if sha in referenced}
            total = sum(live.values())
            removed: list[str] = []
            for manifest in entries:
                if total <= max_bytes:
                    break
                self._manifest_path(manifest.commit).unlink(missing_ok=True)
                removed.append(manifest.commit)
                still = {
                    f.sha256 for m in entries if m.commit not in removed for f in m.files.values()
                }
                for sha in {f.sha256 for f in manifest.files.values()} - still:
                    if sha in live:
                        self.blob_path(sha).unlink(missing_ok=True)
                        total -= live.pop(sha)
                        freed += blobs[sha]
            # Partial downloads older than a day will not be resumed by anyone.
            cutoff = time.time() - 86400
            for part in self.dirs["downloads"].glob("*.part"):
                if part.stat().st_mtime < cutoff:
                    freed += part.stat().st_size
                    part.unlink(missing_ok=True)
        return GcResult(tuple(removed), freed, total)

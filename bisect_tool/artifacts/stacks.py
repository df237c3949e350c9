"""Python sides: an end's package as a directory the runtime can pin (``bisect locate``).

A *Python side* is the package of one end (a release or a commit) with that end's own compiled
swap-set files in place: ``pinned_package_dir`` of a lifetime that runs "this end's Python with
that end's compiled extension". It comes from the release wheel (every member but the swap set,
which the artifact cache already has, so the compiled files outside the swap set stay the
release's own), from the clone (``git archive`` of the package at the commit), or from a folder
the user gives (``--good-python DIR``). The cache keeps it like an artifact, under
``stacks/<id>/`` with a ``.complete`` marker written last: a half-extracted stack (a kill
mid-way) is extracted again, never used.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.artifacts.extract import open_wheel
from bisect_tool.errors import ArtifactUnavailable, UsageError
from bisect_tool.interfaces import SwapSet
from bisect_tool.recipes.limits import inside

COMPLETE = ".complete"


def _stacks(cache: ArtifactCache) -> Path:
    path = cache.root / "stacks"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_side(cache: ArtifactCache, key: str) -> Path | None:
    """The stack of ``key`` when a complete one is cached."""
    root = _stacks(cache) / key
    return root if (root / COMPLETE).is_file() else None


def _finish(root: Path, swap: SwapSet, origin: str) -> Path:
    """Put the end's own swap-set files in place and mark the stack complete."""
    for rel, blob in swap.files.items():
        dest = inside(root, rel, "swap-set file")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        shutil.copyfile(blob, dest)
    (root / COMPLETE).write_text(json.dumps({"origin": origin, "created": time.time(),
                                             "swap_sha256": dict(swap.sha256)}))
    return root


def _fresh(cache: ArtifactCache, key: str) -> tuple[Path, Path]:
    """A scratch folder to build the stack in, and where it goes when done."""
    final = _stacks(cache) / key
    shutil.rmtree(final, ignore_errors=True)  # an incomplete one from a killed run
    work = Path(tempfile.mkdtemp(prefix=f"stack-{key[:20]}-", dir=cache.dirs["tmp"]))
    return work, final


def _build(
    cache: ArtifactCache, key: str, swap: SwapSet, origin: str, fill: Callable[[Path], None]
) -> Path:
    """The cached stack of ``key``, else one ``fill`` writes into a scratch folder, completed
    with ``swap``'s files and moved into place (one builder per key across processes)."""
    with cache.lock(f"stack-{key}"):
        found = cached_side(cache, key)
        if found is not None:
            return found
        work, final = _fresh(cache, key)
        try:
            fill(work)
            _finish(work, swap, origin)
            work.replace(final)
            return final
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise


def side_from_wheel(
    cache: ArtifactCache, key: str, wheel: Path, swap: SwapSet, swap_set: Sequence[str]
) -> Path:
    """Every member of ``wheel`` except the swap set, then ``swap``'s files: the release's
    Python side with its own extension."""
    def fill(work: Path) -> None:
        skip = set(swap_set)
        with open_wheel(wheel) as archive:
            for info in archive.infolist():
                if info.is_dir() or info.filename in skip:
                    continue
                dest = inside(work, info.filename, "wheel member")
                dest.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, dest.open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)

    return _build(cache, key, swap, str(wheel), fill)


def side_from_git(
    cache: ArtifactCache, key: str, repo: Path, commit: str, package: str, swap: SwapSet
) -> Path:
    """``git archive`` of ``package/`` at ``commit`` in ``repo``, then ``swap``'s files."""
    def fill(work: Path) -> None:
        done = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", commit, "--", f"{package}/"],
            capture_output=True, check=False,
        )
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
            raise ArtifactUnavailable(f"no {package}/ at {commit[:12]} in {repo}: {why[0]}")
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            for member in tar.getmembers():
                inside(work, member.name, "archive member")  # refuse paths out of it
            tar.extractall(work, filter="data")

    return _build(cache, key, swap, f"git:{repo}@{commit}", fill)


def side_from_dir(path: Path, package: str) -> Path:
    """A folder the user gives: it must hold ``package/`` (site-packages style)."""
    path = path.expanduser()
    if (path / package).is_dir():
        return path.absolute()
    if path.name == package and path.is_dir():
        return path.parent.absolute()
    raise UsageError(
        f"{path} holds no {package}/ folder; give the site-packages (or the folder) that holds "
        f"the end's {package} package"
    )

"""A private overlay of the pinned package with the candidate's files in place of the pinned ones.

The pinned install is never modified: the overlay mirrors the package's directories as real
directories and links every file back to the pinned install, except the swapped files, which
link to the artifact cache. Put first on PYTHONPATH, ``import vllm`` then finds the overlay, and
``vllm._C_stable_libtorch`` resolves to the candidate's build. ``__pycache__`` directories are
real too, so a ``.pyc`` that Python decides to rewrite replaces the link in the overlay (Python
writes a temp file and renames it), never the pinned file.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path, PurePosixPath

from bisect_tool.errors import RecipeError

OVERLAY_PREFIX = "bisect-overlay-"


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80] or "x"


def split_swap_path(rel: str) -> tuple[str, str]:
    """``vllm/_C.abi3.so`` -> (``vllm``, ``_C.abi3.so``); checks the path stays inside the root."""
    path = PurePosixPath(rel)
    if path.is_absolute() or not path.parts or ".." in path.parts:
        raise RecipeError(
            f"swap path '{rel}' must be relative to the install root, e.g. vllm/_C.abi3.so"
        )
    if len(path.parts) == 1:
        return "", path.parts[0]
    return path.parts[0], str(PurePosixPath(*path.parts[1:]))


def _mirror(src: Path, dst: Path, skip: set[str]) -> None:
    """Real directories, symlinked files (and symlinked symlinks), except the ``skip`` paths."""
    dst.mkdir(parents=True, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = Path(dirpath).relative_to(src)
        out_dir = dst / rel_dir
        for name in list(dirnames):
            full = Path(dirpath) / name
            if full.is_symlink():  # os.walk does not descend into these: keep them as links
                (out_dir / name).symlink_to(os.readlink(full))
            else:
                (out_dir / name).mkdir(exist_ok=True)
        for name in filenames:
            rel = (rel_dir / name).as_posix()
            if rel in skip:
                continue
            (out_dir / name).symlink_to(Path(dirpath, name).absolute())


@contextlib.contextmanager
def overlay(
    files: Mapping[str, Path],
    package_dir: Callable[[str], Path],
    *,
    tag: str,
    parent: Path | None = None,
    whole: Collection[str] = (),
) -> Iterator[Path]:
    """A temp install root holding the mirrored packages of ``files``; removed on exit.

    ``package_dir(pkg)`` gives the pinned directory of top-level package ``pkg``. A package in
    ``whole`` is not mirrored: ``files`` hold all of it (a candidate's own Python side), so a
    module the candidate lacks is not taken from the pinned one.
    """
    by_package: dict[str, dict[str, Path]] = {}
    for rel, cached in files.items():
        pkg, rest = split_swap_path(rel)
        by_package.setdefault(pkg, {})[rest] = Path(cached)
    for rel, cached in files.items():
        if not Path(cached).is_file():
            raise RecipeError(f"swap file for {rel} is missing from the cache: {cached}")
    root = Path(tempfile.mkdtemp(prefix=f"{OVERLAY_PREFIX}{safe_name(tag)}-", dir=parent))
    try:
        for pkg, swapped in by_package.items():
            target = root / pkg if pkg else root
            if pkg and pkg not in whole:
                _mirror(package_dir(pkg), target, set(swapped))
            for rest, cached in swapped.items():
                dest = target / rest
                dest.parent.mkdir(parents=True, exist_ok=True)
                if dest.is_symlink() or dest.exists():
                    dest.unlink()
                dest.symlink_to(cached.resolve())
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)

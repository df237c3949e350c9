"""``bisect artifacts ...``: fetch, ls, gc, extract, import.

Imported by bisect_tool/cli/ at start-up, so only click and the standard library are imported
at module level; gitpython, docker, tenacity and httpx are imported by the commands that need
them (``extract`` and ``import`` of a full SHA run on a GPU machine without them).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import click

from bisect_tool.errors import RangeError, UsageError
from bisect_tool.recipes.completion import complete_recipe
from bisect_tool.recipes.recipe import ArtifactSettings, RuntimeSettings
from bisect_tool.values import short

DEFAULT_RECIPE = "batch-invariance"
FULL_SHA = re.compile(r"^[0-9a-fA-F]{40}$")


def _echo_err(message: str) -> None:
    click.echo(message, err=True)


def _runtime(recipe: str | None) -> RuntimeSettings | None:
    """The recipe's [runtime]: its pinned torch picks the CUDA variant of per-commit wheels."""
    from bisect_tool.recipes import recipe as recipes

    try:
        return recipes.load(recipe or DEFAULT_RECIPE).runtime
    except Exception:  # no bundled default: the tool's own interpreter is asked
        return None


def _settings(recipe: str | None, members: tuple[str, ...] = ()) -> ArtifactSettings:
    """The recipe's [artifacts]; --member overrides its swap set. The default recipe is used
    only where it is bundled; without it, --member is required."""
    from bisect_tool.recipes import recipe as recipes

    if recipe is None:
        try:
            recipes.find(DEFAULT_RECIPE)
            recipe = DEFAULT_RECIPE
        except Exception:
            if not members:
                raise UsageError(
                    f"no bundled recipe '{DEFAULT_RECIPE}'; give --member PATH or --recipe NAME"
                ) from None
            return ArtifactSettings(swap_set=members)
    settings = recipes.load(recipe).artifacts
    if members:
        settings = dataclasses.replace(settings, swap_set=members)
    return settings


def _with_cache_dir(settings: ArtifactSettings, cache_dir: str | None) -> ArtifactSettings:
    return dataclasses.replace(settings, cache_dir=cache_dir) if cache_dir else settings


def resolve_ref(repo_path: Path, ref: str) -> tuple[str, tuple[str, ...]]:
    """A ref -> (full SHA, tags pointing at it). A full SHA needs no git (GPU machine)."""
    try:
        import git
    except ImportError:
        if FULL_SHA.match(ref):
            return ref.lower(), ()
        raise UsageError(f"'{ref}' needs gitpython to resolve; give the full 40-hex SHA") from None
    try:
        repo = git.Repo(repo_path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        if FULL_SHA.match(ref):
            return ref.lower(), ()
        raise UsageError(f"{repo_path} is not a git clone; give --repo PATH") from None
    from bisect_tool import range as range_mod

    with repo:
        try:
            sha = range_mod.resolve_ref(repo, ref)
        except RangeError as exc:
            if FULL_SHA.match(ref):  # e.g. artifacts imported for a commit this clone lacks
                return ref.lower(), ()
            raise RangeError(f"{exc} in {repo_path}") from None
        tags = tuple(sorted(t for t in repo.git.tag("--points-at", sha).split() if t))
        return sha, tags


@click.group("artifacts")
def artifacts_group() -> None:
    """Fetch, list and clean the cached compiled extensions of candidates."""


cache_option = click.option(
    "--cache-dir",
    default=None,
    help="Cache folder (default: $BISECT_CACHE_DIR, else the user cache dir: ~/.cache/bisect).",
)
recipe_option = click.option(
    "--recipe", default=None, help=f"Recipe name or path (default: {DEFAULT_RECIPE}).",
    shell_complete=complete_recipe,
)


@artifacts_group.command("fetch")
@click.argument("refs", nargs=-1, required=True)
@recipe_option
@click.option("--repo", "repo", default=".", type=click.Path(path_type=Path), show_default=True)
@cache_option
def fetch_command(refs: tuple[str, ...], recipe: str | None, repo: Path, cache_dir: str | None):
    """Fetch (or build) the swap set of each REF into the cache."""
    from bisect_tool.artifacts import make_provider

    settings = _with_cache_dir(_settings(recipe), cache_dir)
    resolved = [resolve_ref(repo, ref) for ref in refs]
    with make_provider(
        settings, repo, progress=_echo_err, runtime=_runtime(recipe)
    ) as provider:
        for sha, tags in resolved:
            swap = provider.get(sha, tags)
            for rel, path in swap.files.items():
                click.echo(f"{sha[:12]}  {swap.source:<12}  {swap.sha256[rel][:16]}  {rel}  {path}")
        _echo_err(f"downloaded {provider.bytes_downloaded} bytes")


@artifacts_group.command("ls")
@cache_option
def ls_command(cache_dir: str | None) -> None:
    """List cached commits, most recently used first."""
    import time

    from bisect_tool.artifacts.cache import ArtifactCache
    from bisect_tool.dirs import default_cache_dir

    cache = ArtifactCache(default_cache_dir(cache_dir or ""))
    entries = cache.entries()
    for m in entries:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.last_used))
        click.echo(
            f"{short(m.commit)}  {m.source:<12}  {len(m.files)} file(s)  "
            f"{m.total_bytes:>12}  {used}"
        )
    click.echo(f"{len(entries)} commit(s), {cache.total_bytes()} bytes in {cache.root}", err=True)


@artifacts_group.command("gc")
@click.option("--max-bytes", type=click.IntRange(min=0), default=None,
              help="Cap (default: the recipe's).")
@recipe_option
@cache_option
def gc_command(max_bytes: int | None, recipe: str | None, cache_dir: str | None) -> None:
    """Evict least recently used commits until the cache fits the cap."""
    from bisect_tool.artifacts.cache import ArtifactCache
    from bisect_tool.dirs import default_cache_dir

    if max_bytes is None:
        try:
            max_bytes = _settings(recipe).cache_max_bytes
        except UsageError:
            max_bytes = ArtifactSettings().cache_max_bytes
    if max_bytes < 0:
        raise UsageError("--max-bytes must be >= 0")
    cache = ArtifactCache(default_cache_dir(cache_dir or ""))
    result = cache.gc(max_bytes)
    for commit in result.removed:
        click.echo(f"evicted {short(commit)}")
    click.echo(f"freed {result.freed_bytes} bytes; {result.remaining_bytes} bytes remain")


@artifacts_group.command("extract")
@click.argument("wheel", type=click.Path(path_type=Path))
@click.option("--member", "members", multiple=True, help="Path inside the wheel (repeatable).")
@click.option("--out", "out", default=".", type=click.Path(path_type=Path), show_default=True)
@recipe_option
def extract_command(wheel: Path, members: tuple[str, ...], out: Path, recipe: str | None) -> None:
    """Extract only the swap-set members of WHEEL (no full unzip); print sha256, size, path."""
    from bisect_tool.artifacts.extract import extract_members

    swap = members or _settings(recipe).swap_set
    _check_out(out, swap)
    for item in extract_members(wheel, swap, out):
        click.echo(f"{item.sha256}  {item.size:>12}  {item.path}")


def _check_out(out: Path, members: tuple[str, ...]) -> None:
    """``--out`` and each member's folder under it can be made and written, or a one-line
    UsageError that blames ``--out``: a write error there is no fault of the wheel's."""
    from bisect_tool.recipes.limits import inside

    # Each name first (one climbing out of --out, even through a link, is refused before
    # anything is made), then the folders the members land in.
    folders = {out} | {inside(out, m, "wheel member").parent for m in members}
    for folder in sorted(folders):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise UsageError(
                f"--out {out}: {folder} is a file, not a folder; give --out a folder"
            ) from None
        except OSError as exc:
            raise UsageError(
                f"--out {out}: cannot make {folder} ({exc.strerror or exc}); give --out a folder "
                "you can write"
            ) from None
        if not folder.is_dir():  # a link to a file, or another file type
            raise UsageError(f"--out {out}: {folder} is not a folder; give --out a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UsageError(f"--out {out}: {folder} is not writable; give --out a folder you "
                             "can write")


@artifacts_group.command("import")
@click.option("--commit", "ref", default=None, help="SHA or tag the files belong to.")
@click.option(
    "--release", "release", default=None,
    help="Or: the release of the recipe's package they belong to (0.26.0 or v0.26.0), for "
    "`bisect start --releases` on a machine that cannot download.",
)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--member", "members", multiple=True, help="Swap-set path (default: the recipe's).")
@recipe_option
@click.option("--repo", "repo", default=".", type=click.Path(path_type=Path), show_default=True)
@cache_option
def import_command(
    ref: str | None,
    release: str | None,
    files: tuple[Path, ...],
    members: tuple[str, ...],
    recipe: str | None,
    repo: Path,
    cache_dir: str | None,
) -> None:
    """Put a wheel, or the swap-set files themselves, into the cache for a commit or a release
    (for machines that cannot download)."""
    from bisect_tool.artifacts.cache import ArtifactCache
    from bisect_tool.dirs import default_cache_dir

    settings = _settings(recipe, members)
    if (ref is None) == (release is None):
        raise UsageError("give one of --commit REF or --release VERSION")
    if release is not None:
        from bisect_tool.artifacts.releases import parse_release_ref, release_id

        sha = release_id(settings.package, parse_release_ref(release))
    else:
        assert ref is not None
        sha, _tags = resolve_ref(repo, ref)
    cache = ArtifactCache(default_cache_dir(cache_dir or settings.cache_dir))
    swap = cache.import_paths(sha, list(files), settings.swap_set)
    for rel, path in swap.files.items():
        click.echo(f"{sha[:12]}  {swap.sha256[rel]}  {rel}  {path}")

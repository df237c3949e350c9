"""Where pip would look for a package: its configuration (index, extra indexes, find-links,
no-index), asked of pip itself, and the files those places list."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

from packaging.utils import canonicalize_name

from bisect_tool.artifacts.download import Downloader, GaveUp, NotFound
from bisect_tool.artifacts.index import IndexFile, fetch_project_files, parse_html

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


def _pip_command() -> list[str] | None:
    """How to run the user's pip: the tool's own interpreter's (``python -m pip``), else the
    ``pip`` on PATH (a tool installed without pip, as ``uv tool`` does); None without one."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    found = shutil.which("pip3") or shutil.which("pip")
    return [found] if found else None


def pip_settings(
    env: Mapping[str, str] | None = None, home: Path | None = None
) -> dict[str, str]:
    """What pip's configuration says for ``pip install``, asked of pip itself (``pip config
    list`` under ``env``, HOME as ``home``): its merged files' [global] then [install] values,
    then the ``PIP_*`` environment variables (``:env:``) over both, the order in which pip's
    option parser applies them. Keys are pip's option names (``index-url``). Without a pip to
    ask, the ``PIP_*`` variables alone (no pip, no pip.conf read by it)."""
    import ast
    import subprocess

    env = dict(os.environ if env is None else env)
    if home is not None:
        env["HOME"] = str(home)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    items: dict[str, str] = {}
    command = _pip_command()
    done = None
    if command is not None:
        try:
            done = subprocess.run([*command, "config", "list"], capture_output=True, text=True,
                                  env=env, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            done = None
    if done is not None and done.returncode == 0:
        for line in done.stdout.splitlines():
            key, sep, value = line.partition("=")
            if not sep or "." not in key:
                continue
            try:
                items[key] = str(ast.literal_eval(value))  # pip prints each value's repr
            except (ValueError, SyntaxError):
                items[key] = value.strip("'\"")
    else:
        items = {f":env:.{_pip_name(k[4:])}": v for k, v in env.items()
                 if k.startswith("PIP_") and k not in ("PIP_VERSION", "PIP_HELP")}
    out: dict[str, str] = {}
    for section in ("global", "install", ":env:"):
        out.update({_pip_name(k.split(".", 1)[1]): v for k, v in items.items()
                    if k.split(".", 1)[0] == section})
    return out


def pip_config(env: Mapping[str, str] | None = None, home: Path | None = None) -> PipIndexes:
    """The indexes and find-links locations ``pip install`` would use (see ``pip_settings``)."""
    settings = pip_settings(env, home)
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

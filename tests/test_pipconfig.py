"""Issue 30: the tool reads pip's configuration as pip reads it, and lists releases from every
place pip would look: its index, extra indexes (http and file://) and find-links folders.

pip itself is the oracle: its own option parser (``pip install``'s options, in a child) for the
configuration, and ``pip index versions`` for the listing, both against real config files and
real indexes on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from gitrepos import run_cli
from wheelindex import PACKAGE, DemoIndex, IndexEntry

from bisect_tool.artifacts.download import Downloader, RetryPolicy
from bisect_tool.artifacts.pipindex import PYPI, PipIndexes, pip_config
from bisect_tool.artifacts.releases import fetch_listing, list_releases
from bisect_tool.errors import NoAnswer

TAG = "py3-none-linux_x86_64"  # what pip accepts on this machine: it filters by tag


def wheel_name(version: str) -> str:
    return f"{PACKAGE}-{version}-{TAG}.whl"


@pytest.fixture()
def pip_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment whose pip reads only the files a test writes: no PIP_* variables, a home,
    XDG dirs and a site-wide dir of its own (/etc/pip.conf and the venv's pip.conf stay: both
    pip and the tool read them, and neither names an index here)."""
    for key in list(os.environ):
        if key.startswith("PIP_"):
            monkeypatch.delenv(key)
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "home/.config"),
           "XDG_CONFIG_DIRS": str(tmp_path / "etc-xdg")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "home/.config/pip").mkdir(parents=True)
    return env


def pips_own_options(extra_env: dict[str, str] | None = None) -> PipIndexes:
    """What ``pip install`` would use, by pip's own option parser in a child process."""
    script = (
        "import json\n"
        "from pip._internal.commands import create_command\n"
        "options, _ = create_command('install').parse_args([])\n"
        "print(json.dumps([options.index_url, options.extra_index_urls, options.find_links,\n"
        "                  options.no_index]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, **(extra_env or {})}, check=True)
    index, extra, links, no_index = json.loads(done.stdout.strip().splitlines()[-1])
    return PipIndexes(index, tuple(extra), tuple(links), bool(no_index))


CONFIGS = [
    ({}, {}, {}),  # nothing: PyPI
    ({"user": "[global]\nindex-url = http://127.0.0.1:9/u\n"}, {}, {}),
    # [install] wins over [global], the XDG user file over the legacy one, lists split on space
    ({"legacy": "[global]\nindex-url = http://127.0.0.1:9/legacy\nfind-links = /w1\n",
      "user": "[global]\nindex-url = http://127.0.0.1:9/g\n"
              "[install]\nindex_url = http://127.0.0.1:9/i\n"
              "extra-index-url =\n  http://127.0.0.1:9/e1\n  file:///srv/e2\n"}, {}, {}),
    # PIP_CONFIG_FILE (existing): the user files are not read; the env vars win over every file
    ({"user": "[global]\nindex-url = http://127.0.0.1:9/skipped\nfind-links = /w1\n",
      "env": "[global]\nextra-index-url = http://127.0.0.1:9/x\nno-index = yes\n"},
     {"PIP_CONFIG_FILE": "env"}, {"PIP_FIND_LINKS": "/a /b"}),
    ({"site": "[global]\nindex-url = http://127.0.0.1:9/site\n",
      "user": "[global]\nindex-url = http://127.0.0.1:9/user\n"}, {}, {}),
    # /dev/null: no file at all, the variables still count
    ({"user": "[global]\nindex-url = http://127.0.0.1:9/user\n"},
     {"PIP_CONFIG_FILE": os.devnull}, {"PIP_EXTRA_INDEX_URL": "http://127.0.0.1:9/v"}),
]


@pytest.mark.parametrize("files, paths, variables", CONFIGS)
def test_the_configuration_is_read_as_pip_reads_it(
    tmp_path: Path, pip_env: dict[str, str], files: dict[str, str], paths: dict[str, str],
    variables: dict[str, str],
) -> None:
    places = {"user": tmp_path / "home/.config/pip/pip.conf",
              "legacy": tmp_path / "home/.pip/pip.conf",
              "site": tmp_path / "etc-xdg/pip/pip.conf",
              "env": tmp_path / "env.conf"}
    for name, text in files.items():
        places[name].parent.mkdir(parents=True, exist_ok=True)
        places[name].write_text(text)
    env = dict(variables)
    for key, value in paths.items():
        env[key] = str(places[value]) if value in places else value
    ours = pip_config({**os.environ, **env}, home=tmp_path / "home")
    assert ours == pips_own_options(env)


def _file_index(root: Path, versions: list[str]) -> str:
    """A file:// simple index (``<root>/demollm/index.html``, as pip reads one) of ``versions``;
    the wheels beside the page, linked relatively."""
    project = root / PACKAGE
    project.mkdir(parents=True)
    links = []
    for v in versions:
        (project / wheel_name(v)).write_bytes(b"wheel " + v.encode())
        links.append(f'<a href="{wheel_name(v)}">{wheel_name(v)}</a><br/>')
    (project / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>")
    return root.resolve().as_uri()


@pytest.fixture()
def four_places(tmp_path: Path, pip_env: dict[str, str]):  # type: ignore[no-untyped-def]
    """pip.conf naming a loopback index (0.24.0, 0.25.0), a second loopback index (0.26.0), a
    file:// index (0.27.0) and a find-links folder of wheels (0.28.0, and another project's)."""
    first = DemoIndex([IndexEntry(wheel_name(v), b"w" + v.encode()) for v in ("0.24.0", "0.25.0")])
    second = DemoIndex([IndexEntry(wheel_name("0.26.0"), b"w0.26.0")])
    file_index = _file_index(tmp_path / "file-index", ["0.27.0"])
    links = tmp_path / "wheels"
    links.mkdir()
    (links / wheel_name("0.28.0")).write_bytes(b"w0.28.0")
    (links / f"other-1.0-{TAG}.whl").write_bytes(b"other")
    with first, second:
        (tmp_path / "home/.config/pip/pip.conf").write_text(
            f"[global]\nindex-url = {first.index_url}\n"
            f"extra-index-url =\n    {second.index_url}\n    {file_index}\n"
            f"find-links = {links}\n"
        )
        yield first, second


def test_releases_are_listed_from_every_place_pip_would_look(
    four_places: tuple[DemoIndex, DemoIndex], tmp_path: Path
) -> None:
    first, second = four_places
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", PACKAGE],
                          capture_output=True, text=True, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("Available versions:"))
    pips = sorted(line.split(":", 1)[1].replace(",", " ").split())
    before = first.gets[first.project_path], second.gets[second.project_path]
    listing = fetch_listing(PACKAGE, pip_config().index_url, tmp_path / "cache")
    assert listing.source == "index" and listing.index_url == first.index_url
    assert sorted(str(r.version) for r in listing.releases) == pips == [
        "0.24.0", "0.25.0", "0.26.0", "0.27.0", "0.28.0"]
    assert (first.gets[first.project_path], second.gets[second.project_path]) == (
        before[0] + 1, before[1] + 1)
    assert second.index_url in listing.places and "find-links" in listing.places
    # an index named on purpose (--index-url, the recipe's index_url) is read alone
    alone = fetch_listing(PACKAGE, second.index_url, tmp_path / "cache2")
    assert [str(r.version) for r in alone.releases] == ["0.26.0"] and not alone.places


@pytest.mark.slow  # a whole release-level start over a real index
def test_start_releases_resolves_a_range_only_the_extra_places_complete(
    four_places: tuple[DemoIndex, DemoIndex], tmp_path: Path
) -> None:
    recipe = tmp_path / "r.toml"
    # no source can serve a release: the run stops at once, untestable ends; the range is the
    # point
    recipe.write_text(f'name = "r"\n[artifacts]\npackage = "{PACKAGE}"\nsources = ["local"]\n'
                      f'swap_set = ["demollm/_kernels.so"]\ncache_dir = "{tmp_path / "cache"}"\n')
    state = tmp_path / "st"
    code, _, err = run_cli("start", "--releases", "--good", "0.28.0", "--bad", "0.24.0",
                           "--recipe", str(recipe), "--no-controls", "--state-dir", str(state))
    assert code == NoAnswer.exit_code, err
    header = json.loads((state / "journal.jsonl").read_text().split("\n")[0])
    assert [c["sha"] for c in header["candidates"]] == [
        f"{PACKAGE}-0.24.0", f"{PACKAGE}-0.25.0", f"{PACKAGE}-0.26.0", f"{PACKAGE}-0.27.0",
        f"{PACKAGE}-0.28.0"]


def test_an_unreachable_extra_index_leaves_out_only_what_it_holds(
    tmp_path: Path, pip_env: dict[str, str]
) -> None:
    with DemoIndex([IndexEntry(wheel_name("0.26.0"), b"w")]) as index:
        gone = DemoIndex([])
        with gone:
            pass  # started and stopped: nothing listens there
        places = PipIndexes(index.index_url, (gone.index_url,))
        with httpx.Client() as client:
            once = Downloader(client, RetryPolicy(attempts=1, sleep=lambda s: None))
            listed = list_releases(PACKAGE, index.index_url, once, tmp_path / "cache", places)
    assert [str(r.version) for r in listed.releases] == ["0.26.0"]
    assert gone.index_url in listed.offline_reason  # said, not silent
    assert not (tmp_path / "cache" / "index").exists()  # a partial listing is not saved


def test_release_wheels_from_a_file_index_and_find_links_are_used_in_place(
    tmp_path: Path, pip_env: dict[str, str], demollm_wheels  # type: ignore[no-untyped-def]
) -> None:
    import shutil

    from bisect_tool.artifacts import make_provider
    from bisect_tool.demo.pinned import SWAP_PATH
    from bisect_tool.recipes.recipe import ArtifactSettings

    project = tmp_path / "file-index" / PACKAGE
    project.mkdir(parents=True)
    shutil.copy(demollm_wheels.wheels["0.27.0"], project)
    name = demollm_wheels.wheels["0.27.0"].name
    (project / "index.html").write_text(f'<a href="{name}">{name}</a>\n')
    links = tmp_path / "wheels"
    links.mkdir()
    shutil.copy(demollm_wheels.wheels["0.26.0"], links)
    (tmp_path / "home/.config/pip/pip.conf").write_text(
        f"[global]\nindex-url = {(tmp_path / 'file-index').resolve().as_uri()}\n"
        f"find-links = {links}\n"
    )
    assert pip_config().index_url != PYPI
    settings = ArtifactSettings(sources=("release",), swap_set=(SWAP_PATH,), package=PACKAGE,
                                cache_dir=str(tmp_path / "cache"))
    with make_provider(settings, tmp_path) as provider:
        for version in ("0.27.0", "0.26.0"):
            swap = provider.get(f"{PACKAGE}-{version}", (f"v{version}",))
            assert swap.files[SWAP_PATH].read_bytes() == demollm_wheels.kernel_bytes(version)
        assert provider.bytes_downloaded == 0
    # the user's wheels stay where they are
    assert (project / name).is_file() and len(list(links.iterdir())) == 1


def test_no_index_without_find_links_is_one_line(tmp_path: Path, pip_env: dict[str, str]) -> None:
    from bisect_tool.errors import RangeError

    with httpx.Client() as client, pytest.raises(RangeError, match="says no-index and names no"):
        list_releases(PACKAGE, PYPI, Downloader(client), tmp_path, PipIndexes(no_index=True))

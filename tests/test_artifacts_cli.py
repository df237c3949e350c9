"""The `bisect artifacts` commands, the cache's LRU gc, and extraction without optional deps."""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
from pathlib import Path

import git
import pytest

from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.artifacts.testing import WheelServer, make_wheel
from bisect_tool.cli import main
from bisect_tool.dirs import default_cache_dir

MEMBER = "vllm/_C_stable_libtorch.abi3.so"


def blob(tag: str, size: int = 100_000) -> bytes:
    return random.Random(tag).randbytes(size)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_extract_prints_sha_and_size_of_only_the_member(tmp_path, capsys):
    wheel = make_wheel(tmp_path / "w.whl", {MEMBER: blob("x"), "vllm/big.so": blob("y")})
    code, out, _ = run(
        capsys,
        "artifacts",
        "extract",
        str(wheel),
        "--member",
        MEMBER,
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 0
    sha = hashlib.sha256(blob("x")).hexdigest()
    assert out.split() == [sha, "100000", str(tmp_path / "out" / MEMBER)]
    assert sorted(p.name for p in (tmp_path / "out").rglob("*") if p.is_file()) == [
        Path(MEMBER).name
    ]


def test_extract_of_a_damaged_wheel_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip at all")
    code, out, err = run(capsys, "artifacts", "extract", str(bad), "--member", MEMBER)
    assert code == 7
    assert err.count("\n") == 1 and err.startswith("bisect: bad.whl is not a readable wheel")


def test_extract_runs_without_gitpython_docker_tenacity(tmp_path):
    wheel = make_wheel(tmp_path / "w.whl", {MEMBER: blob("x")})
    block = "import sys; [sys.modules.__setitem__(m, None) for m in ('git', 'docker', 'tenacity')]"
    code = f"{block}; from bisect_tool.cli import main; main(sys.argv[1:])"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "artifacts",
            "extract",
            str(wheel),
            "--member",
            MEMBER,
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert hashlib.sha256(blob("x")).hexdigest() in done.stdout


def test_import_then_ls_then_gc_evicts_least_recently_used(tmp_path, capsys):
    cache = tmp_path / "cache"
    shas = ["1" * 40, "2" * 40, "3" * 40]
    for i, sha in enumerate(shas):
        so = tmp_path / f"{i}" / "_C_stable_libtorch.abi3.so"
        so.parent.mkdir()
        so.write_bytes(blob(sha))
        code, out, err = run(
            capsys,
            "artifacts",
            "import",
            "--commit",
            sha,
            str(so),
            "--member",
            MEMBER,
            "--cache-dir",
            str(cache),
            "--repo",
            str(tmp_path),
        )
        assert code == 0, err
        assert hashlib.sha256(blob(sha)).hexdigest() in out
    store = ArtifactCache(cache)
    assert store.lookup(shas[0], [MEMBER]) is not None  # touch: commit 1 is now the newest
    code, out, _ = run(capsys, "artifacts", "ls", "--cache-dir", str(cache))
    assert out.splitlines()[0].startswith(shas[0][:12]) and len(out.splitlines()) == 3
    code, out, _ = run(
        capsys, "artifacts", "gc", "--max-bytes", "150000", "--cache-dir", str(cache)
    )
    assert code == 0
    assert store.lookup(shas[0], [MEMBER]) is not None
    assert store.lookup(shas[1], [MEMBER]) is None and store.lookup(shas[2], [MEMBER]) is None
    assert store.total_bytes() == 100_000


def test_import_rejects_files_outside_the_swap_set(tmp_path, capsys):
    other = tmp_path / "other.so"
    other.write_bytes(b"x")
    code, _, err = run(
        capsys,
        "artifacts",
        "import",
        "--commit",
        "4" * 40,
        str(other),
        "--member",
        MEMBER,
        "--cache-dir",
        str(tmp_path / "c"),
    )
    assert code == 2 and "not in the swap set" in err


def test_fetch_resolves_a_tag_and_uses_the_recipe(tmp_path, capsys, monkeypatch):
    repo_path = tmp_path / "repo"
    with git.Repo.init(repo_path) as repo:
        (repo_path / "f").write_text("x")
        repo.index.add(["f"])
        sha = repo.index.commit(
            "c", author=git.Actor("t", "t@x"), committer=git.Actor("t", "t@x")
        ).hexsha
        repo.create_tag("v0.26.0")
    with WheelServer() as server:
        wheel = make_wheel(tmp_path / "rel.whl", {MEMBER: blob("rel")})
        server.add_release(
            "vllm", "vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl", wheel.read_bytes()
        )
        monkeypatch.setenv("PIP_INDEX_URL", server.url + "/simple")
        recipe = tmp_path / "r.toml"
        recipe.write_text(
            f'name = "t"\n[artifacts]\nsources = ["release"]\nswap_set = ["{MEMBER}"]\n'
            f'cache_dir = "{tmp_path / "cache"}"\n'
        )
        code, out, err = run(
            capsys,
            "artifacts",
            "fetch",
            "v0.26.0",
            "--recipe",
            str(recipe),
            "--repo",
            str(repo_path),
        )
        assert code == 0, err
        assert out.startswith(sha[:12]) and "release" in out
        code, _, err = run(
            capsys, "artifacts", "fetch", "v0.26", "--recipe", str(recipe), "--repo", str(repo_path)
        )
        assert code == 3 and "did you mean v0.26.0?" in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG dirs are Linux's")
def test_cache_dir_precedence_flag_then_env_then_user_cache_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("BISECT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert run(capsys, "artifacts", "ls")[2].endswith(f"in {tmp_path / 'xdg' / 'bisect'}\n")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home_cache = tmp_path / "home" / ".cache" / "bisect"
    assert run(capsys, "artifacts", "ls")[2].endswith(f"in {home_cache}\n")
    monkeypatch.setenv("BISECT_CACHE_DIR", str(tmp_path / "env"))
    assert run(capsys, "artifacts", "ls")[2].endswith(f"in {tmp_path / 'env'}\n")
    flag = tmp_path / "flag"
    assert run(capsys, "artifacts", "ls", "--cache-dir", str(flag))[2].endswith(f"in {flag}\n")
    # The recipe's [artifacts] cache_dir is the same first place (the provider passes it).
    assert default_cache_dir(str(tmp_path / "recipe")) == tmp_path / "recipe"


def test_cache_dir_without_platformdirs_is_the_home_cache(tmp_path):
    # The GPU machine may get only the stdlib and click/httpx (see bisect_tool/artifacts).
    code = (
        "import sys; sys.modules['platformdirs'] = None; "
        "from bisect_tool.dirs import default_cache_dir; print(default_cache_dir())"
    )
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / ".cache" / "bisect")

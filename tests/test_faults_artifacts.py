"""Issue 38, artifacts: `artifacts extract`/`import` had no size cap (a 4 MB zip expanded to 4 GiB),
and a full disk was blamed on a "damaged wheel" to be fetched again. Real zips, a real full disk
(a 1 MiB tmpfs in a mount namespace of its own, where the machine allows one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from gitrepos import linear, run_cli

from bisect_tool.artifacts.extract import BOMB_FLOOR, MAX_MEMBER_BYTES
from bisect_tool.artifacts.testing import make_wheel
from bisect_tool.errors import ArtifactUnavailable, InfrastructureError

MEMBER = "vllm/_C.abi3.so"


def bomb(path: Path, size: int) -> Path:
    """A wheel whose one member is ``size`` zero bytes, packed (about 1000x)."""
    block = bytes(16 << 20)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open(MEMBER, "w", force_zip64=True) as out:
            for _ in range(size // len(block)):
                out.write(block)
        archive.writestr("vllm-0.0.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: vllm\n")
    return path


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("bisect: "), err
    return lines[0]


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_a_member_that_packs_a_thousandfold_is_refused_unpacked(tmp_path: Path) -> None:
    wheel = bomb(tmp_path / "bomb.whl", 4 * BOMB_FLOOR)
    assert wheel.stat().st_size < 2 * 1024**2  # 256 MiB in under 2 MB
    out = tmp_path / "out"
    code, _, err = run_cli("artifacts", "extract", str(wheel), "--member", MEMBER,
                           "--out", str(out))
    assert code == ArtifactUnavailable.exit_code
    line = one_line(err)
    assert f"would unpack to {4 * BOMB_FLOOR:,} bytes" in line and "no vLLM wheel" in line
    assert files_under(out) == []


def test_import_of_such_a_wheel_puts_nothing_in_the_cache(tmp_path: Path) -> None:
    repo = linear(tmp_path / "repo", 2)
    wheel = bomb(tmp_path / "bomb.whl", 4 * BOMB_FLOOR)
    cache = tmp_path / "cache"
    code, _, err = run_cli("artifacts", "import", "--commit", "HEAD", str(wheel), "--member",
                           MEMBER, "--repo", str(repo.path), "--cache-dir", str(cache))
    assert code == ArtifactUnavailable.exit_code and "would unpack to" in one_line(err)
    assert not [p for p in files_under(cache) if p.stat().st_size > 1024**2]


@pytest.mark.slow
def test_a_4_mb_zip_that_expands_to_4_gib_is_refused(tmp_path: Path) -> None:
    """The issue's case, whole (30 s to pack here)."""
    wheel = bomb(tmp_path / "bomb.whl", 4 * 1024**3)
    assert wheel.stat().st_size < 5 * 1024**2
    out = tmp_path / "out"
    code, _, err = run_cli("artifacts", "extract", str(wheel), "--member", MEMBER,
                           "--out", str(out))
    assert code == ArtifactUnavailable.exit_code and f"{4 * 1024**3:,} bytes" in one_line(err)
    assert f"{MAX_MEMBER_BYTES:,}" in err and files_under(out) == []


def test_a_real_wheel_member_is_still_taken(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024**2)  # does not pack: a compiled file packs 2-4x
    wheel = make_wheel(tmp_path / "w.whl", {MEMBER: data})
    code, out, err = run_cli("artifacts", "extract", str(wheel), "--member", MEMBER,
                             "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert (tmp_path / "out" / MEMBER).read_bytes() == data


def _in_a_full_disk(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``bisect ARGV`` with ``tmp_path/disk`` a 1 MiB tmpfs (a mount namespace of its own)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): cannot make a small disk here")
    script = (f"mount -t tmpfs -o size=1m tmpfs {disk} || exit 99; "
              f'exec "$0" -m bisect_tool "$@"')
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script, sys.executable, *argv],
                          capture_output=True, text=True, timeout=120)
    if done.returncode == 99 or "unshare failed" in done.stderr:
        pytest.skip(f"cannot mount a small disk here: {done.stderr.strip()}")
    return done


def test_a_full_disk_is_reported_as_a_full_disk_not_a_damaged_wheel(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w.whl", {MEMBER: os.urandom(3 * 1024**2)})
    out = tmp_path / "disk" / "out"
    done = _in_a_full_disk(tmp_path, ["artifacts", "extract", str(wheel), "--member", MEMBER,
                                      "--out", str(out)])
    assert done.returncode == InfrastructureError.exit_code, done.stderr
    line = one_line(done.stderr)
    assert f"no space left on the disk of {out / 'vllm'}" in line and "free space" in line
    assert "damaged" not in line and "fetch it again" not in line

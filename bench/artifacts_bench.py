"""Artifacts benchmark, on loopback (run: .venv/bin/python bench/artifacts_bench.py).

Prints ratios against baselines measured in the same run:
- download: the provider (resume-capable, hashed, locked, extracted) vs a plain httpx stream of the
  same wheel to a file;
- extraction: one ~50 MB member of a ~300 MB stored wheel vs unzipping the whole wheel;
- a second run over the cached commit: network bytes (must be 0).
Random incompressible data in a temp dir, deleted afterwards.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisect_tool.artifacts import make_provider  # noqa: E402
from bisect_tool.artifacts.extract import extract_members, full_unzip  # noqa: E402
from bisect_tool.artifacts.testing import WheelServer  # noqa: E402
from bisect_tool.recipes.recipe import ArtifactSettings  # noqa: E402

MEMBER = "vllm/_C_stable_libtorch.abi3.so"
COMMIT = "c" * 40
MB = 1024 * 1024


def build_wheel(path: Path, member_mb: int = 50, total_mb: int = 300) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(MEMBER, os.urandom(member_mb * MB))
        rest, i = total_mb - member_mb, 0
        while rest > 0:
            size = min(50, rest)
            archive.writestr(f"vllm/other_{i}.so", os.urandom(size * MB))
            rest, i = rest - size, i + 1


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bisect-bench-") as tmp_name:
        tmp = Path(tmp_name)
        wheel = tmp / "vllm.whl"
        build_wheel(wheel)
        size = wheel.stat().st_size
        data = wheel.read_bytes()

        # Extraction: one member vs the whole wheel.
        t_member = min(timed(lambda: extract_members(wheel, [MEMBER], tmp / "m")) for _ in range(3))
        t_full = min(timed(lambda: full_unzip(wheel, tmp / "full")) for _ in range(2))

        with WheelServer() as server:
            url = server.add_commit_wheel(COMMIT, data)
            del data

            def plain() -> None:
                with (
                    httpx.Client() as client,
                    client.stream("GET", url) as r,
                    (tmp / "plain.whl").open("wb") as out,
                ):
                    for chunk in r.iter_raw():
                        out.write(chunk)

            t_plain = min(timed(plain) for _ in range(2))
            settings = ArtifactSettings(
                sources=("wheel-index",),
                swap_set=(MEMBER,),
                wheel_index_url=server.url,
                cache_dir=str(tmp / "cache"),
            )

            def fetch_fresh() -> None:
                for path in (tmp / "cache").glob("manifests/*.json"):
                    path.unlink()
                with make_provider(settings, tmp) as provider:
                    provider.get(COMMIT)

            t_provider = min(timed(fetch_fresh) for _ in range(2))
            sent = server.bytes_sent
            with make_provider(settings, tmp) as provider:
                t_cached = timed(lambda: provider.get(COMMIT))
                second_bytes = provider.bytes_downloaded
            assert server.bytes_sent == sent

    print(f"wheel {size / MB:.0f} MB, member 50 MB (stored, random data)")
    print(f"download  plain httpx {size / MB / t_plain:7.0f} MB/s")
    print(f"download  provider    {size / MB / t_provider:7.0f} MB/s  (fetch + verify + extract)")
    print(f"ratio provider/plain throughput: {t_plain / t_provider:.2f}")
    print(
        f"extract member {t_member * 1000:.0f} ms vs full unzip {t_full * 1000:.0f} ms: "
        f"ratio full/member {t_full / t_member:.1f}x"
    )
    print(f"second run: {second_bytes} network bytes, {t_cached * 1000:.1f} ms (must be 0 bytes)")
    if second_bytes != 0:
        raise SystemExit("second run downloaded bytes")


if __name__ == "__main__":
    main()

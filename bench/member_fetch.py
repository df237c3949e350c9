"""Member fetch by HTTP range against whole wheels, on a loopback wheel index throttled to a
stated bandwidth (run: .venv/bin/python bench/member_fetch.py [--mbps 25] [--candidates 3]).

The wheels are shaped like vLLM's at a fifth of the size (vllm-facts.md: a 304 MB wheel whose
swap-set member is 57.5 MB deflated; here about 61 MB with an 11.5 MB member, incompressible,
and 3000 small files so the central directory has vLLM's kind of length). For each candidate
commit the tool's own provider fetches the swap set twice into fresh caches: once as it does by
default (the end records, the central directory and the member, by range) and once from a host
that ignores ranges (its whole-wheel fallback). Printed per candidate: bytes the host sent and
seconds, and the ratios whole / members measured in the same run; then the check that the
member fetch moved no more than the member's compressed size + its local header + the central
directory + the end records.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisect_tool.artifacts import make_provider  # noqa: E402
from bisect_tool.artifacts.cuda import PinnedCuda  # noqa: E402
from bisect_tool.artifacts.wheelhost import HostedCommit, WheelHost  # noqa: E402
from bisect_tool.recipes.recipe import ArtifactSettings  # noqa: E402

MEMBER = "vllm/_C_stable_libtorch.abi3.so"
MB = 1_000_000


def build_wheel(path: Path, seed: str) -> Path:
    rng = random.Random(seed)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("vllm/__init__.py", b"# python side\n")
        for i in range(3000):
            z.writestr(f"vllm/model_executor/layers/module_{i:04d}.py",
                       f"# module {i}\nVALUE = {i}\n".encode())
        z.writestr(MEMBER, rng.randbytes(11_500_000))
        for name, size in (("vllm/_C.abi3.so", 9_000_000), ("vllm/_moe_C.abi3.so", 8_000_000),
                           ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", 24_000_000),
                           ("vllm/third_party/deep_gemm/_C.so", 8_000_000)):
            z.writestr(name, rng.randbytes(size))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbps", type=float, default=25.0, help="bandwidth, MB/s (default 25)")
    parser.add_argument("--candidates", type=int, default=3)
    args = parser.parse_args()
    rate = int(args.mbps * MB)
    commits = [f"{i:x}" * 40 for i in range(10, 10 + args.candidates)]
    with tempfile.TemporaryDirectory(prefix="bisect-bench-") as tmp_name:
        tmp = Path(tmp_name)
        wheels = {c: build_wheel(tmp / f"{c[:8]}.whl", c) for c in commits}
        rows = []
        with WheelHost(lambda commit, variant: wheels[commit], rate_bps=rate) as host:
            host.add(*(HostedCommit(c) for c in commits))
            for commit in commits:
                wheel_path = host.wheel_url(commit).split(host.url, 1)[1]
                for mode in ("members", "whole"):
                    host.ignore_ranges = mode == "whole"
                    settings = ArtifactSettings(
                        sources=("wheel-index",), swap_set=(MEMBER,),
                        wheel_index_url=host.url,
                        cache_dir=str(tmp / f"cache-{mode}-{commit[:4]}"),
                    )
                    host.wheel_path(commit, "cu130")  # built before the clock starts
                    before = host.bytes_sent([wheel_path])
                    start = time.perf_counter()
                    with make_provider(settings, tmp, pinned_cuda=PinnedCuda("13.0", "bench"),
                                       progress=lambda _m: None) as provider:
                        provider.get(commit)
                    rows.append((commit, mode, host.bytes_sent([wheel_path]) - before,
                                 time.perf_counter() - start))
        print(f"# python bench/member_fetch.py --mbps {args.mbps:g} --candidates "
              f"{args.candidates}")
        print(f"loopback wheel index throttled to {args.mbps:g} MB/s; wheels of "
              f"{wheels[commits[0]].stat().st_size / MB:.1f} MB, swap-set member "
              f"{MEMBER} (11.5 MB, deflated random bytes)")
        by = {(c, m): (b, t) for c, m, b, t in rows}
        bound_ok = True
        for commit in commits:
            (mb, mt), (wb, wt) = by[(commit, "members")], by[(commit, "whole")]
            with zipfile.ZipFile(wheels[commit]) as archive:
                info = archive.getinfo(MEMBER)
                size = wheels[commit].stat().st_size
                bound = (info.compress_size + 30 + len(MEMBER) + len(info.extra)
                         + size - archive.start_dir)
            bound_ok &= mb <= bound
            print(f"  {commit[:12]}  members {mb / MB:7.2f} MB {mt:6.2f} s   whole "
                  f"{wb / MB:7.2f} MB {wt:6.2f} s   whole/members: bytes {wb / mb:5.2f}x, "
                  f"time {wt / mt:5.2f}x   (bound {bound / MB:.2f} MB: "
                  f"{'within' if mb <= bound else 'OVER'})")
        total_m = sum(by[(c, "members")][0] for c in commits)
        total_w = sum(by[(c, "whole")][0] for c in commits)
        time_m = sum(by[(c, "members")][1] for c in commits)
        time_w = sum(by[(c, "whole")][1] for c in commits)
        print(f"  all {len(commits)}: members {total_m / MB:.2f} MB in {time_m:.2f} s, whole "
              f"{total_w / MB:.2f} MB in {time_w:.2f} s: bytes {total_w / total_m:.2f}x, "
              f"time {time_w / time_m:.2f}x fewer with members")
        if not bound_ok:
            raise SystemExit("a member fetch moved more than members + directory + headers")


if __name__ == "__main__":
    main()

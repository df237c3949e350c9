"""Benchmark: does the server probe keep all M+F requests in flight, and what does it cost?

Starts the loopback test server (tests/probe_servers.py) in its own process, so its CPU time is
not the client's, then:
1. runs the probe with the seed's workload (31 requests + 13 fillers, 5 repeats, 24 tokens) and
   prints the server-side peak of concurrent requests (must equal M+F) and the probe's verdict;
2. prints the client's CPU time per pass (``time.process_time`` around the run / passes) next
   to a baseline measured in the same run: a bare httpx loop sending the same bodies the same
   way (all at once, same passes), with no comparison, parsing or /metrics polling.

Run: .venv/bin/python bench/probe_bench.py [--hold-ms 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bisect_tool.interfaces import ServerHandle
from bisect_tool.probes.server import ServerDeterminismProbe
from bisect_tool.probes.workload import request_body
from bisect_tool.recipes.recipe import ProbeSettings

ROOT = Path(__file__).resolve().parents[1]


async def bare_passes(url: str, bodies: list[bytes], passes: int) -> None:
    limits = httpx.Limits(max_connections=len(bodies) + 8)
    async with httpx.AsyncClient(limits=limits, timeout=60, trust_env=False) as client:
        for _ in range(passes):
            responses = await asyncio.gather(*(
                client.post(url + "/v1/completions", content=b,
                            headers={"content-type": "application/json"}) for b in bodies))
            for r in responses:
                r.raise_for_status()


async def bare_slot_passes(url: str, bodies: list[bytes], passes: int) -> None:
    """The floor: one single-connection client per request, as the probe does, but no parsing,
    comparison or /metrics polling."""
    tls = ssl.create_default_context()
    clients = [httpx.AsyncClient(timeout=60, trust_env=False, verify=tls) for _ in bodies]
    try:
        for _ in range(passes):
            responses = await asyncio.gather(*(
                c.post(url + "/v1/completions", content=b,
                       headers={"content-type": "application/json"})
                for c, b in zip(clients, bodies, strict=True)))
            for r in responses:
                r.raise_for_status()
    finally:
        for c in clients:
            await c.aclose()


def stats(url: str) -> dict[str, int]:
    return httpx.get(url + "/stats", trust_env=False).json()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hold-ms", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    settings = ProbeSettings(repeats=args.repeats, jitter_ms=0.0)  # the seed's 31 + 13
    n = settings.requests + settings.fillers
    passes = args.repeats + 1  # the priming pass is real traffic too
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "probe_servers.py"), "--hold-ms", str(args.hold_ms)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        probe = ServerDeterminismProbe(settings)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = probe.run(ServerHandle(url, "bench", Path("/dev/null")))
        probe_cpu, probe_wall = time.process_time() - cpu0, time.perf_counter() - wall0
        peak = stats(url)["max_running"]

        bodies = [request_body(p, "test-model", settings.max_tokens, settings.logprobs)
                  for p in probe.workload.prompts]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        asyncio.run(bare_passes(url, bodies, passes))
        base_cpu, base_wall = time.process_time() - cpu0, time.perf_counter() - wall0
        cpu0 = time.process_time()
        asyncio.run(bare_slot_passes(url, bodies, passes))
        floor_cpu = time.process_time() - cpu0
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(timeout=10)

    print(f"workload: {settings.requests} requests + {settings.fillers} fillers, "
          f"{args.repeats} repeats + priming, max_tokens {settings.max_tokens}, "
          f"server hold {args.hold_ms:.0f} ms")
    print(f"verdict: {result.verdict.value} ({result.message})")
    print(f"server-side peak concurrency: {peak} (M+F = {n}) -> "
          f"{'all in flight at once' if peak == n else 'NOT all in flight'}")
    per_repeat = result.detail["coresidency_per_repeat"]
    print(f"probe-side co-residency per repeat (/metrics): {per_repeat}, "
          f"{result.detail['metrics_samples']} samples")
    print(f"client CPU per pass: probe {1000 * probe_cpu / passes:.1f} ms, "
          f"bare httpx {1000 * base_cpu / passes:.1f} ms, "
          f"ratio {probe_cpu / base_cpu:.2f}x; floor (bare client per request, no parsing) "
          f"{1000 * floor_cpu / passes:.1f} ms, probe/floor {probe_cpu / floor_cpu:.2f}x")
    print(f"wall per pass: probe {1000 * probe_wall / passes:.1f} ms, "
          f"bare httpx {1000 * base_wall / passes:.1f} ms")
    print(json.dumps({"peak": peak, "n": n, "probe_cpu_ms_per_pass": 1000 * probe_cpu / passes,
                      "bare_cpu_ms_per_pass": 1000 * base_cpu / passes,
                      "floor_cpu_ms_per_pass": 1000 * floor_cpu / passes}))


if __name__ == "__main__":
    main()

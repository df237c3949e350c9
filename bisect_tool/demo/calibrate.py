"""Measure the demo target: how often a lifetime diverges, how long it takes.

``python -m bisect_tool.demo.calibrate --lifetimes 20 [--fixed]`` boots fresh demollm servers
(the pinned ``_kernels.so``, or with ``--fixed`` the one built from the generated history's
``v0.27.0``) and runs the server probe's workload in each: M shared-prefix requests plus F
fillers, all submitted concurrently with 0..jitter ms random delays, one priming pass and R
repeats, every repeat compared with every other. It is a measuring tool for sizing the demo
recipe; the real probe lives in ``bisect_tool.probes``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool import recipe as recipe_mod
from bisect_tool.demo.history import generate
from bisect_tool.demo.pinned import STACK_DIR, SWAP_PATH, ensure_pinned_build, run_build
from bisect_tool.errors import BootFailed
from bisect_tool.probes.metrics import STEP_TOKENS, MetricsFormatError, parse
from bisect_tool.recipe import ProbeSettings

_PORT = re.compile(r"Starting vLLM API server 0 on http://127\.0\.0\.1:(\d+)")


@dataclass(frozen=True)
class LifetimeResult:
    divergent: bool
    distinct_outputs: int  # distinct repeat outputs (1: reproducible)
    big_steps: int  # engine steps of 256 tokens or more (from /metrics), -1 if unknown
    wall_s: float  # boot + probe


@contextmanager
def demo_server(kernels: Path, env: dict[str, str], args: tuple[str, ...] = ()) -> Iterator[str]:
    """A fresh demollm process on loopback using ``kernels`` as its ``_kernels.so``."""
    with tempfile.TemporaryDirectory(prefix="demollm-lifetime-") as tmp:
        root = Path(tmp)
        shutil.copytree(
            STACK_DIR / "demollm",
            root / "demollm",
            ignore=shutil.ignore_patterns("__pycache__", "_kernels.so*"),
        )
        shutil.copyfile(kernels, root / SWAP_PATH)
        log = (root / "server.log").open("w+")
        proc = subprocess.Popen(
            [sys.executable, "-m", "demollm.server", "--host", "127.0.0.1", "--port", "0", *args],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                text = (root / "server.log").read_text()
                found = _PORT.search(text)
                if found:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise BootFailed(f"demollm did not start:\n{text[-2000:]}")
                time.sleep(0.02)
            yield f"http://127.0.0.1:{found.group(1)}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def _post(url: str, body: bytes, timeout: float) -> Any:
    request = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def workload(p: ProbeSettings) -> list[bytes]:
    rng = random.Random(f"calibrate:{p.seed}")
    high = max(p.vocab_size - 512, 101)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, high) for _ in range(n)]

    prefix = ids(p.prefix_tokens)
    prompts = [prefix + ids(p.prompt_tokens) for _ in range(p.requests)]
    prompts += [ids(p.filler_tokens) for _ in range(p.fillers)]
    return [
        json.dumps(
            {
                "model": "demo",
                "prompt": prompt,
                "max_tokens": p.max_tokens,
                "temperature": 0.0,
                "seed": 0,
                "logprobs": p.logprobs,
                "ignore_eos": True,
                "return_tokens_as_token_ids": True,
                "return_token_ids": True,
            }
        ).encode()
        for prompt in prompts
    ]


def run_pass(url: str, bodies: list[bytes], jitter_ms: float, rng: random.Random) -> str:
    """One concurrent pass; returns a canonical JSON of what the comparison looks at."""
    delays = [rng.uniform(0, jitter_ms / 1000) for _ in bodies]

    def one(i: int) -> object:
        time.sleep(delays[i])
        choice = _post(url, bodies[i], 120)["choices"][0]
        lp = choice["logprobs"]
        return [choice["token_ids"], lp["token_logprobs"], lp["top_logprobs"]]

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return json.dumps(list(pool.map(one, range(len(bodies)))))


def run_lifetime(kernels: Path, p: ProbeSettings, env: dict[str, str]) -> LifetimeResult:
    start = time.perf_counter()
    bodies = workload(p)
    rng = random.Random()
    with demo_server(kernels, env) as url:
        run_pass(url, bodies, p.jitter_ms, rng)  # priming pass, discarded
        outputs = [run_pass(url, bodies, p.jitter_ms, rng) for _ in range(p.repeats)]
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    big = _steps_over_255(metrics)
    distinct = len(set(outputs))
    return LifetimeResult(distinct > 1, distinct, big, time.perf_counter() - start)


def _steps_over_255(page: str) -> int:
    """Engine steps of >= 256 tokens, from the demo's ``le="255.0"`` bucket; -1 if unknown."""
    try:
        steps = parse(page).histograms.get(STEP_TOKENS)
    except MetricsFormatError:
        return -1
    small = dict(steps.buckets).get(255.0) if steps else None
    return -1 if steps is None or small is None else int(steps.count - small)


def fixed_kernels(workdir: Path) -> Path:
    """``_kernels.so`` built from the generated history's good end (v0.27.0)."""
    history = generate(workdir / "repo")
    tree = workdir / "tree"
    subprocess.run(
        ["git", "-C", str(history.repo), "worktree", "add", "-q", str(tree), history.good_tag],
        check=True,
    )
    return run_build(tree)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bisect_tool.demo.calibrate")
    parser.add_argument("--lifetimes", type=int, default=20)
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--fixed", action="store_true", help="use v0.27.0's kernels")
    parser.add_argument("--no-invariance", action="store_true", help="unset the switch")
    parser.add_argument("--jitter-ms", type=float, default=None)
    parser.add_argument("--prompt-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    r = recipe_mod.load(args.recipe).override(
        "probe", jitter_ms=args.jitter_ms, prompt_tokens=args.prompt_tokens
    )
    env = dict(r.runtime.env)
    if args.no_invariance:
        env.pop(r.probe.invariance_env, None)
    with tempfile.TemporaryDirectory(prefix="demo-calibrate-") as tmp:
        kernels = fixed_kernels(Path(tmp)) if args.fixed else ensure_pinned_build()
        results = []
        for n in range(args.lifetimes):
            res = run_lifetime(kernels, r.probe, env)
            results.append(res)
            print(
                f"lifetime {n}: divergent={res.divergent} distinct={res.distinct_outputs} "
                f"steps>=256={res.big_steps} wall={res.wall_s:.2f}s",
                flush=True,
            )
    rate = sum(r.divergent for r in results) / len(results)
    walls = sorted(r.wall_s for r in results)
    print(
        f"divergent lifetimes: {sum(r.divergent for r in results)}/{len(results)} ({rate:.0%}); "
        f"median lifetime {walls[len(walls) // 2]:.2f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

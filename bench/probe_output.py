"""Reading a chatty probe: what its output costs the tool, against the probe writing to a file.

    python bench/probe_output.py [--mb 100] [--repeats 3]

Issue 38: since the lifetime's log is redacted as it is written (issue 30), a probe printing 100
MB ran into ``--run-timeout 15`` although it took 0.08 s, and a chatty one ran up to 200x slower:
every regular expression of ``bisect_tool.redact`` ran over every 64 KiB read. Now each runs only
where the words it needs are in the read (an exact test, ``redact._Hints``).

For each kind of output this runs, in the same process and one after the other, the probe with
its output sent straight to a file (the baseline: the shell's own redirect), ``runprobe.run_group``
keeping only the tail (no log), ``run_group`` writing the redacted log as a lifetime does, and
the same with every shape run over every read (``_Hints`` forced on: the reader before the
fix). It prints seconds (the best of ``--repeats``) and each one's ratio to the baseline: a
ratio, not a timed test, since the machine's load moves both sides.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bisect_tool import redact  # noqa: E402
from bisect_tool.runtime import runprobe  # noqa: E402

VLLM_LINE = ("INFO 12-07 14:00:01 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 "
             "tokens/s, Avg generation throughput: 52.1 tokens/s, Running: 4 reqs, Waiting: 0 "
             "reqs, GPU KV cache usage: 1.2%, Prefix cache hit rate: 0.0%")


def shapes(mb: int) -> dict[str, str]:
    size = mb * 1_000_000
    return {
        "yes (2-byte lines)": f"yes | head -c {size}",
        "vLLM log lines": f"yes '{VLLM_LINE}' | head -c {size}",
        "one line, no newline": f"head -c {size} /dev/zero | tr '\\0' y",
        "seq (short lines)": f"seq 1 {size // 8}",
    }


def best(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


class _EveryShape:
    """``redact._Hints`` as if every word were present: each shape runs over every read."""

    private_key = token = url = pair = auth = lower_pair = True

    def __init__(self, value: str) -> None:
        pass

    def shapes(self) -> list[object]:
        return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runprobe.run_group(["true"])  # the imports of the first call are no part of any row
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "lifetime.log"
        print(f"{'output':<22} {'file':>7} {'tail':>7} {'log':>7} {'before':>7}   "
              "tail/file log/file before/file")
        for name, command in shapes(args.mb).items():
            def logged(command: str = command) -> None:
                log.unlink(missing_ok=True)
                runprobe.run_group(["bash", "-c", command], log=log)

            def to_file(command: str = command) -> None:
                subprocess.run(["bash", "-c", f"{command} > {log}"], check=True)

            def tail_only(command: str = command) -> None:
                runprobe.run_group(["bash", "-c", command])

            base = best(args.repeats, to_file)
            tail = best(args.repeats, tail_only)
            with_log = best(args.repeats, logged)
            hints = redact._Hints
            redact._Hints = _EveryShape  # type: ignore[assignment,misc]
            try:
                before = best(1, logged)
            finally:
                redact._Hints = hints  # type: ignore[misc]
            print(f"{name:<22} {base:7.2f} {tail:7.2f} {with_log:7.2f} {before:7.2f}   "
                  f"{tail / base:9.1f} {with_log / base:8.1f} {before / base:11.1f}")


if __name__ == "__main__":
    main()

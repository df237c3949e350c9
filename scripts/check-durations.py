#!/usr/bin/env python3
"""Measure each test file's seconds in the fast tier and write tests/check-seconds.json, which
``make check`` balances its halves by (tests/conftest.py). Runs ``scripts/check.sh`` with
pytest's own timings (``--durations=0 --durations-min=0``: setup, call and teardown of every
test), sums them by file, and prints the halves the new table makes. Rerun it when a file's
tests grow or shrink a lot; a file it has not measured is weighed by its test count meanwhile.

    scripts/check-durations.py            (about as long as one `make check`)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".pytest-tmp" / "logs"
TABLE = ROOT / "tests" / "check-seconds.json"
LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+?)::")


def parse(text: str) -> dict[str, dict[str, float]]:
    """{file: {"seconds": setup + call + teardown of its tests, "tests": tests called}} from
    pytest's ``--durations`` lines."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        seconds, when, name = float(m[1]), m[2], m[3]
        entry = out.setdefault(name, {"seconds": 0.0, "tests": 0})
        entry["seconds"] += seconds
        entry["tests"] += when == "call"
    return out


def main() -> int:
    run = subprocess.run(["bash", str(ROOT / "scripts" / "check.sh"), "--durations=0",
                          "--durations-min=0"], cwd=ROOT)
    if run.returncode:
        print("check-durations: make check failed; the table is left as it was", file=sys.stderr)
        return 1
    table: dict[str, dict[str, float]] = {}
    for log in sorted(LOGS.glob("shard*.log")):
        table.update(parse(log.read_text()))
    # a file whose every test is slow or needs Docker weighs nothing in the fast tier; only a
    # file not in the table at all (new since) is weighed as the median file
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        table.setdefault(f"tests/{path.name}", {"seconds": 0.0, "tests": 0})
    table = {k: {"seconds": round(v["seconds"], 2), "tests": int(v["tests"])}
             for k, v in sorted(table.items())}
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import shard_files

    weights = {k: v["seconds"] for k, v in table.items()}
    count = len(list(LOGS.glob("shard*.log")))
    for i, share in enumerate(shard_files(weights, count)):
        print(f"check-durations: share {i + 1} of {count}: {sum(weights[f] for f in share):.1f} "
              f"s of tests in {len(share)} files")
    print(f"check-durations: wrote {TABLE.relative_to(ROOT)} ({len(table)} files, "
          f"{sum(weights.values()):.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

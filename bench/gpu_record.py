"""Issue 31's GPU figures, read back from a committed record of real runs (no GPU needed).

    python bench/gpu_record.py [DIR ...]      (default: every docs/bench/gpu-*/ folder)

A record is what ``scripts/gpu/release_range.sh report`` brought back from the lent GPU: the
journal of the tiered run (``journal-tiered.jsonl``: the op check narrows, lifetimes confirm)
and of the same range with ``--no-narrow`` (``journal-nonarrow.jsonl``), plus the seconds each
device call of a run took (``times-MODE.tsv``). Both ran on one machine in one session, so the
card named in the journals' environment entry is the same for both.

Time to answer is the run's own time: from its journal header to its end entry, less the time
between device calls when a run was resumed (a call's deadline stops it with SIGTERM, the next
call's ``bisect resume`` goes on), so waiting for the machine never counts; a short pause
between two calls does count, and so do the lifetimes the deadline tore down. Prints each figure
against its limit (issue 31: at most 300 s to answer the ten-release range with cached
artifacts) and the ratio no-narrow / tiered of time and lifetimes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: issue 31, item 4: the ten releases 0.22.0 .. 0.28.0, cached artifacts, tiered
LIMIT_S = 300.0
#: a pause between two entries longer than this is the run stopped and resumed by a later call
#: (one lifetime of vLLM takes about a minute; the controls under two)
RESUME_GAP_S = 400.0


@dataclass(frozen=True)
class Run:
    mode: str
    card: str
    answer: str
    confidence: float
    state: str
    active_s: float  # header to end, less the pauses between device calls
    span_s: float  # header to end
    lifetimes: int  # server lifetimes (the controls' not counted)
    refused: int  # lifetimes the pinned stack's gate refused before a server booted
    control_lifetimes: int
    op_runs: int
    builds: int
    candidates: int
    resumes: int


def _entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_run(path: Path, mode: str) -> Run:
    entries = _entries(path)
    times = [float(e["time"]) for e in entries if isinstance(e.get("time"), (int, float))]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b - a > RESUME_GAP_S]
    header = entries[0]
    env: dict[str, Any] = next((e for e in entries if e.get("type") == "environment"), {})
    end: dict[str, Any] = next((e for e in reversed(entries) if e.get("type") == "end"), {})
    summary = end.get("summary") or {}
    observations = [e for e in entries if e.get("type") == "observation"]
    controls = [e for e in entries if e.get("type") == "controls"]
    # a candidate built from source says so in every observation's swap_source (the cache
    # keeps where its files came from): count candidates, not observations
    builds = len({o.get("commit") for o in observations
                  if (o.get("detail") or {}).get("swap_source") == "source-build"})
    return Run(
        mode=mode,
        card=str(env.get("gpu") or "unknown card"),
        answer=str(summary.get("flip_commit") or "-"),
        confidence=float(summary.get("confidence") or 0.0),
        state=str(end.get("state") or "running"),
        active_s=(times[-1] - times[0] - sum(gaps)) if times else 0.0,
        span_s=(times[-1] - times[0]) if times else 0.0,
        lifetimes=sum(1 for o in observations if (o.get("tier") or "faithful") == "faithful"
                      and o.get("verdict") != "untestable"),
        refused=sum(1 for o in observations if (o.get("tier") or "faithful") == "faithful"
                    and o.get("verdict") == "untestable"),
        control_lifetimes=sum(int(c.get("attempts") or 1) for c in controls
                              if not c.get("untestable")),
        op_runs=sum(1 for o in observations if o.get("tier") == "narrow"),
        builds=builds,
        candidates=len(header.get("candidates") or ()),
        resumes=max(len(gaps), _calls(path.parent / f"times-{path.stem.split('-')[-1]}.tsv") - 1),
    )


def _calls(times: Path) -> int:
    """The device calls a run took (``release_range.sh`` appends one row a call), 0 unknown."""
    if not times.is_file():
        return 0
    return sum(1 for line in times.read_text().splitlines() if line.strip())


def report(folder: Path) -> list[str]:
    tiered_path, plain_path = folder / "journal-tiered.jsonl", folder / "journal-nonarrow.jsonl"
    if not tiered_path.is_file():
        return [f"{folder}: no journal-tiered.jsonl"]
    tiered = read_run(tiered_path, "tiered")
    plain = read_run(plain_path, "no-narrow") if plain_path.is_file() else None
    runs = [r for r in (tiered, plain) if r is not None]
    cards = {r.card for r in runs}
    lines = [f"{folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}: "
             f"{tiered.candidates} releases, card {' / '.join(sorted(cards))}"
             + ("" if len(cards) == 1 else " (NOT the same card: the ratio means little)")]
    head = f"  {'':<26}" + "".join(f"{r.mode:>14}" for r in runs) + "   limit"
    lines.append(head)

    def row(name: str, values: list[str], limit: str = "") -> None:
        lines.append(f"  {name:<26}" + "".join(f"{v:>14}" for v in values) + f"   {limit}")

    ok = tiered.state == "done" and tiered.active_s <= LIMIT_S
    row("answer", [f"{r.answer.replace('vllm-', 'v')}" for r in runs])
    row("confidence", [f"{r.confidence:.1%}" for r in runs])
    row("time to answer (s)", [f"{r.active_s:.0f}" for r in runs],
        f"tiered <= {LIMIT_S:.0f} s: {'met' if ok else 'NOT met'}")
    row("server lifetimes", [str(r.lifetimes) for r in runs])
    row("refused by the gate", [str(r.refused) for r in runs], "no server booted")
    row("controls' lifetimes", [str(r.control_lifetimes) for r in runs])
    row("op-check runs", [str(r.op_runs) for r in runs])
    row("builds", [str(r.builds) for r in runs], "cached artifacts: 0")
    row("resumed across calls", [str(r.resumes) for r in runs])
    if plain is not None and tiered.active_s > 0:
        lines.append(
            f"  no-narrow / tiered: {plain.active_s / tiered.active_s:.2f}x time, "
            f"{plain.lifetimes / max(tiered.lifetimes, 1):.2f}x server lifetimes"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path)
    args = parser.parse_args(argv)
    folders = args.folders or sorted((ROOT / "docs" / "bench").glob("gpu-*"))
    if not folders:
        print("no GPU record under docs/bench/gpu-*/", file=sys.stderr)
        return 1
    for folder in folders:
        print("\n".join(report(folder.resolve())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

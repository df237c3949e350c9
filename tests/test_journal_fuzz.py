"""Property: the journal reader, fed any bytes or any lines, gives a readable prefix or a one-line
StateError; never another exception (issue 14, item 5). Replay and the report of whatever it
accepts must not raise either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tier import examples

from bisect_tool import journal as journal_mod
from bisect_tool import report as report_mod
from bisect_tool.designs import ledger
from bisect_tool.errors import StateError

FIXTURE = HealthCheck.function_scoped_fixture
SHAS = [f"{i:040x}" for i in range(1, 6)]
HEADER = {
    "type": "header", "version": 1, "session": "s", "repo": "", "good_ref": "g", "bad_ref": "b",
    "good": SHAS[0], "bad": SHAS[-1], "direction": "regression", "paths": [], "mode": "run",
    "candidates": [{"sha": s, "subject": f"c{i}", "pr": None, "tags": []}
                   for i, s in enumerate(SHAS)],
    "recipe": {"search": {"confidence": 0.9}}, "seq": 0, "time": 0.0,
}
GOOD = [
    {"type": "observation", "lifetime_id": f"{SHAS[4][:12]}-0", "commit": SHAS[4], "position": 4,
     "verdict": "divergent", "detail": {}, "message": "exit 1", "seq": 1},
    {"type": "observation", "lifetime_id": f"{SHAS[0][:12]}-0", "commit": SHAS[0], "position": 0,
     "verdict": "clean", "detail": {"log_tail": "x"}, "message": "exit 0", "seq": 2},
    {"type": "untestable", "commit": SHAS[2], "position": 2, "message": "no artifact", "seq": 3},
    {"type": "end", "state": "done", "message": "m", "summary": {}, "seq": 4},
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8,
)
KEYS = ["type", "position", "commit", "lifetime_id", "verdict", "detail", "message", "state",
        "summary", "positive", "candidates", "direction", "version", "recipe"]


@st.composite
def mutated_entry(draw: st.DrawFn) -> bytes:
    entry = dict(draw(st.sampled_from([HEADER, *GOOD])))
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(KEYS))
        if draw(st.booleans()):
            entry.pop(key, None)
        else:
            entry[key] = draw(json_values)
    return json.dumps(entry).encode()


lines = st.one_of(
    st.just(json.dumps(HEADER).encode()),
    st.sampled_from([json.dumps(e).encode() for e in GOOD]),
    mutated_entry(),
    st.binary(max_size=40),
    json_values.map(lambda v: json.dumps(v).encode()),
)


def _check(tmp: Path, data: bytes) -> None:
    path = tmp / "journal.jsonl"
    path.write_bytes(data)
    try:
        contents = journal_mod.read(path)
    except StateError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    # what the reader accepts, replay and the report can use
    state = ledger.replay(contents)
    state.standing().status()
    report_mod.render_json(report_mod.build_report(contents, state.standing()))


@pytest.mark.slow  # 300 examples, each a journal replayed and reported
@settings(max_examples=300, deadline=None, suppress_health_check=[FIXTURE])
@given(body=st.lists(lines, max_size=8), keep_header=st.booleans(), torn=st.binary(max_size=12))
def test_any_lines_give_a_readable_prefix_or_one_line(
    tmp_path: Path, body: list[bytes], keep_header: bool, torn: bytes
) -> None:
    head = [json.dumps(HEADER).encode()] if keep_header else []
    _check(tmp_path, b"\n".join(head + body) + b"\n" + torn)


@settings(max_examples=examples(200, 50), deadline=None, suppress_health_check=[FIXTURE])
@given(data=st.binary(max_size=300))
def test_any_bytes_give_a_readable_prefix_or_one_line(tmp_path: Path, data: bytes) -> None:
    _check(tmp_path, data)

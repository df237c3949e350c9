"""`bisect report`: a real journal in, Markdown/JSON/plot out, checked the way a reader would.

The journal is written with the real ``Journal``; lifetime details come from the server probe's
own pure functions (``compare_repeats`` + ``decide``), so the report is read against the key
names the probe really writes. The Markdown is parsed with markdown-it (CommonMark + tables).
The posterior plots and the op probe's table: tests/test_report_plot.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from mdtables import cells

from bisect_tool import journal
from bisect_tool.interfaces import ProbeResult
from bisect_tool.journal import Journal, JournalContents
from bisect_tool.probes.compare import Sample, compare_repeats
from bisect_tool.probes.controls import ControlsResult
from bisect_tool.probes.server_verdict import decide
from bisect_tool.report import (
    Standing,
    build_report,
    render_json,
    render_markdown,
)
from bisect_tool.values import Verdict

REPO = "https://github.com/vllm-project/vllm"
TARGET = 44
FIX_PR = 48391
FIX_SUBJECT = (
    "[Bugfix][Kernel] Fix batch invariance in RMSNorm kernels by pinning block size (#48391)"
)


def sha(i: int) -> str:
    return hashlib.sha1(f"commit-{i}".encode()).hexdigest()


SUBJECTS = [
    "[Release] v0.26.0",
    "[Kernel] Vectorise fused_add_rms_norm loads (#47001)",
    "[CI] Bump CUDA to 13.0 (#47120)",
    "[Build] Split _C_stable_libtorch sources (#47333)",
    "[Perf] Tune layernorm launch bounds (#47510)",
    "[Kernel] Add weight-less rms_norm schema (#47802)",
    FIX_SUBJECT,
    "[Misc] Fix typo in cmake message (#48520)",
    "[Kernel] Faster topk_softmax (#48777)",
    "[Release] v0.27.0",
]
FLIP = 6  # the first good commit (direction: fix; the old end, index 0, is bad)
UNTESTABLE = 5


def sample(shift: float) -> Sample:
    return Sample(
        token_ids=(11, 12, 13),
        logprobs=(-0.5 + shift, -1.25, -0.75),
        top=(((11, -0.5 + shift), (7, -2.0)), ((12, -1.25),), ((13, -0.75),)),
    )


def server_result(lifetime_id: str, distinct: int, peaks: Sequence[int | None]) -> ProbeResult:
    """One lifetime as the server probe reports it: ``distinct`` outputs over 5 repeats."""
    repeats = [[sample(1e-3 * (k % distinct)), sample(0.0)] for k in range(5)]
    comparison = compare_repeats(repeats)
    detail: dict[str, Any] = {
        "url": "http://127.0.0.1:41234", "lifetime_id": lifetime_id, "mode": "concurrent",
        "requests": 31, "fillers": 13, "prompt_tokens_total": 1496, "max_tokens": 24,
        "logprobs": 5, "jitter_ms": 40.0, "target_coresidency": TARGET, "redone_repeats": 0,
        "redo_reasons": [], "model": "Qwen/Qwen3-0.6B", "priming_coresidency": peaks[0],
    }
    detail.update(comparison.to_detail())
    known = [p for p in peaks if p is not None]
    detail["coresidency_per_repeat"] = list(peaks)
    detail["max_coresidency"] = max(known, default=None)
    detail["target_reached_repeats"] = sum(1 for p in known if p >= TARGET)
    detail["metrics_samples"] = 120
    verdict, message = decide(comparison, peaks, TARGET)
    return ProbeResult(verdict, detail, message)


FULL = [44] * 5
# (candidate index, lifetime number, distinct outputs, peaks per repeat)
LIFETIMES = [
    (0, 1, 3, FULL), (0, 2, 1, FULL), (0, 3, 2, FULL),  # the bad end: 2 of 3 diverge
    (9, 1, 1, FULL), (9, 2, 1, FULL),  # the good end
    (4, 1, 1, FULL), (4, 2, 4, FULL),
    (7, 1, 1, FULL), (7, 2, 1, [44, 44, 36, 44, 44]),  # the batch never formed once
    (6, 1, 1, FULL), (6, 2, 1, FULL), (6, 3, 1, FULL),
]


def expected_rows() -> dict[int, dict[str, Any]]:
    """What a reader counts by hand from LIFETIMES (independent of the report code)."""
    rows: dict[int, dict[str, Any]] = {}
    for index, _, distinct, peaks in LIFETIMES:
        r = rows.setdefault(index, {"lifetimes": 0, "divergent": 0, "distinct": 1, "verdicts": []})
        r["lifetimes"] += 1
        r["divergent"] += distinct > 1
        r["distinct"] = max(r["distinct"], distinct)
        r["verdicts"].append("divergent" if distinct > 1 else
                             "clean" if min(peaks) >= TARGET else "inconclusive")
    for r in rows.values():
        # as the search counts it: one clean lifetime is evidence, inconclusive ones are not
        r["verdict"] = ("DIVERGENT" if r["divergent"] else
                        "CLEAN" if "clean" in r["verdicts"] else "INCONCLUSIVE")
    rows[2] = {"lifetimes": 1, "divergent": 0, "distinct": None, "verdict": "INCONCLUSIVE"}
    rows[UNTESTABLE] = {"lifetimes": 0, "divergent": 0, "distinct": None, "verdict": "UNTESTABLE"}
    return rows


def write_journal(path: Path) -> None:
    with Journal(path) as j:
        j.append({
            "type": "header", "version": journal.JOURNAL_VERSION, "session": "s-1234",
            "repo": "/src/vllm", "good_ref": "v0.27.0", "bad_ref": "v0.26.0",
            "remote_url": "git@github.com:vllm-project/vllm.git",
            "paths": ["csrc/", "CMakeLists.txt"],
            "good": sha(9), "bad": sha(0), "direction": "fix",
            "candidates": [
                {"sha": sha(i), "subject": s, "pr": None, "tags": []}
                for i, s in enumerate(SUBJECTS)
            ],
            "recipe": {
                "name": "batch-invariance",
                "runtime": {"model": "Qwen/Qwen3-0.6B", "weights": "random",
                            "env": {"VLLM_BATCH_INVARIANT": "1"},
                            "server_args": ["--enforce-eager", "--max-num-seqs", "64"]},
                "artifacts": {"package": "vllm",
                              "swap_set": ["vllm/_C_stable_libtorch.abi3.so"]},
                "probe": {"kind": "server", "requests": 31, "fillers": 13, "repeats": 5,
                          "jitter_ms": 40.0, "target_coresidency": TARGET},
            },
            "tool_version": "0.1.0",
            "command": ["bisect", "start", "--good", "v0.27.0", "--bad", "v0.26.0",
                        "--recipe", "batch-invariance", "--env", "A=has space"],
            "started": 1_700_000_000.0,
        })
        j.append({"type": "environment", "gpu": "NVIDIA H200", "driver": "570.86.15",
                  "python": "3.12.3", "versions": {"torch": "2.11.0+cu130", "vllm": "0.26.0"}})
        pos = server_result("controls-pos", 3, FULL)
        neg = server_result("controls-neg", 1, [1] * 5)
        neg = ProbeResult(Verdict.CLEAN, {**neg.detail, "mode": "sequential"}, "5 repeats "
                          "bitwise identical (sequential)")
        j.append({"type": "controls", **ControlsResult(pos, neg).to_detail()})
        for index, n, distinct, peaks in LIFETIMES:
            lid = f"{sha(index)[:12]}-{n}"
            result = server_result(lid, distinct, peaks)
            entry = {"type": "observation", "lifetime_id": lid, "commit": sha(index),
                     "position": index, "verdict": result.verdict.value,
                     "detail": result.detail, "message": result.message, "duration_s": 61.5}
            j.append(entry)
            if (index, n) == (4, 2):
                j.append(entry)  # a retried task: the same lifetime id must count once
        j.append({"type": "untestable", "commit": sha(UNTESTABLE), "position": UNTESTABLE,
                  "message": "no wheel for this commit and the source build failed: nvcc error"})
        # The generic `--run` probe: no server keys, a log tail in the detail.
        j.append({"type": "observation", "lifetime_id": f"{sha(2)[:12]}-1", "commit": sha(2),
                  "position": 2, "verdict": "inconclusive", "duration_s": 3.0,
                  "detail": {"returncode": 125, "log_tail": "step 1\n```\nTraceback: boom"},
                  "message": "script exited 125 (skip)"})
        j.append({"type": "end", "state": "budget_exhausted", "summary": {"evaluations": 13},
                  "message": "max_evaluations (13) reached"})


def posterior() -> tuple[float, ...]:
    post = [0.0] * len(SUBJECTS)
    post[FLIP], post[7], post[8], post[9] = 0.993, 0.004, 0.002, 0.001
    return tuple(post)


STATE = Standing(
    state="done", direction="fix", flip_block=(sha(FLIP),), confidence=0.993,
    credible_set=(sha(FLIP),), p_median=0.55, p_interval=(0.31, 0.78), q_median=0.02,
    q_interval=(0.0, 0.09), evaluations=13, candidates_tested=6, posterior=posterior(),
)


@pytest.fixture(scope="module")
def contents(tmp_path_factory: pytest.TempPathFactory) -> JournalContents:
    path = tmp_path_factory.mktemp("session") / journal.JOURNAL_NAME
    write_journal(path)
    return journal.read(path)


def parse(md: str) -> list[Any]:
    return MarkdownIt("commonmark").enable("table").parse(md)


def links(md: str) -> list[str]:
    return [str(c.attrGet("href")) for t in parse(md) if t.type == "inline"
            for c in t.children or [] if c.type == "link_open"]


def first_paragraph(md: str) -> str:
    html = MarkdownIt("commonmark").enable("table").render(md)
    start = html.index("<p>")
    return html[start: html.index("</p>", start)]


def evidence_rows(md: str) -> list[list[tuple[str, list[str]]]]:
    """Body rows of the Evidence section's per-candidate table (after "### Evidence")."""
    return cells(md[md.index("### Evidence"):])


def lifetime_rows(md: str) -> list[list[tuple[str, list[str]]]]:
    """Body rows of the Evidence section's folded table of every lifetime."""
    return cells(md[md.index("<summary>Each lifetime"):])


def test_evidence_has_one_row_per_candidate_and_every_lifetime_folded(
    contents: JournalContents,
) -> None:
    md = render_markdown(build_report(contents, STATE))
    rows = lifetime_rows(md)
    journaled = contents.observations
    assert len(rows) == len(journaled)
    # rows by (candidate, lifetime number): the candidate's cell is blank (″) after its first
    by_lifetime: dict[str, list[tuple[str, list[str]]]] = {}
    current = ""
    for row in rows:
        if row[0][0] != "″":
            current = row[0][0][:7]
        by_lifetime[f"{current}-{row[1][0].lstrip('#')}"] = row
    for obs in journaled:
        sha_, number = obs["lifetime_id"].rsplit("-", 1)
        row = by_lifetime[f"{sha_[:7]}-{number}"]
        assert row[2][0] == obs["verdict"].upper()
        detail = obs["detail"]
        if "max_coresidency" in detail:
            assert row[3][0] == f"{detail['max_coresidency']} / {TARGET}"
            assert row[4][0] == f"{detail['distinct_outputs']} / 5"
    # the candidates, one row each: the verdict and role, linked to the vLLM commit; the one
    # that could not run after every result (issue 41: UNTESTABLE rows came first)
    expected = expected_rows()
    candidates = evidence_rows(md)
    assert len(candidates) == len(expected)  # the untestable candidate included
    for row in candidates[:-1]:
        index = next(i for i in expected if row[0][0].startswith(sha(i)[:7]))
        assert row[1][0] == expected[index]["verdict"], row
        assert row[0][1] == [f"{REPO}/commit/{sha(index)}"]
        divergent, lifetimes = expected[index]["divergent"], expected[index]["lifetimes"]
        assert row[2][0].startswith(f"{divergent} of "), row
        assert int(row[2][0].split()[2]) <= lifetimes
    assert "(bad end)" in candidates[0][0][0]
    assert candidates[-1][1][0] == "UNTESTABLE" and candidates[-1][0][0] == sha(UNTESTABLE)[:7]
    assert "Max \\|Δ logprob\\| up to the first differing token" in md
    assert "Co-residency reached / target" in md


def test_headline_says_the_answer_in_words_with_its_confidence(
    contents: JournalContents,
) -> None:
    md = render_markdown(build_report(contents, STATE))
    title = [t for t in parse(md) if t.type == "inline"][0].content
    assert title.startswith("Bisect result: fixed in ")
    assert "its `_C_stable_libtorch.abi3.so` under v0.26.0's Python" in title  # the pinned one
    first = first_paragraph(md)
    assert first.startswith("<p><strong>First good commit</strong>")
    assert f'href="{REPO}/commit/{sha(FLIP)}"' in first
    assert f'href="{REPO}/pull/{FIX_PR}"' in first
    # The subject's brackets stay literal text, and the PR is not repeated in the subject.
    assert "[Bugfix][Kernel] Fix batch invariance in RMSNorm kernels by pinning block size" \
        in first
    assert "<strong>99.3%</strong> that this is the first good commit and both ends" in first
    # what the lifetimes either side showed: the nearest buggy candidate and the flip itself
    assert f"{sha(4)[:7]} showed the bug in 1 of 2 lifetimes" in first
    # what 3 clean lifetimes rule out, and what they do not (issue 38): 1 - 0.01^(1/3) = 78 %
    assert (f"{sha(FLIP)[:7]} was clean in 3 of 3 (which rules out, at 99%, a bug there in 78% "
            "of lifetimes or more; not a rarer one); the controls held") in first
    head = md[: md.index("### How sure")]
    assert "v0.26.0 (bad) .. v0.27.0 (good), 10 commits" in head
    assert "- How sure: 99.3% (the run stops at 99.5%)" not in head  # below it: said so
    assert "below the 99.5% a run stops at today" in head
    sure = {r[0][0]: r[1][0] for r in cells(md[md.index("### How sure"):])}
    assert sure["p: a lifetime with the bug shows it"].startswith("0.55 [0.31, 0.78]")
    assert sure["From the server lifetimes"] == "99.3%"


def test_prs_in_the_range_are_listed_with_links(contents: JournalContents) -> None:
    md = render_markdown(build_report(contents, STATE))
    section = md[md.index("### Changes in the range"): md.index("### Environment")]
    assert "touch the compiled sources (`csrc/`, `CMakeLists.txt`)" in section
    assert f"{REPO}/pull/{FIX_PR}" in links(section)
    assert f"{REPO}/pull/47001" in links(section)


def test_links_only_to_commits_of_the_vllm_remote(
    tmp_path: Path, contents: JournalContents
) -> None:
    path = tmp_path / journal.JOURNAL_NAME
    with Journal(path) as j:
        j.append({**contents.header, "remote_url": "https://example.com/me/fork.git"})
    md = render_markdown(build_report(journal.read(path), STATE))
    assert not [u for u in links(md) if "/commit/" in u]
    # the tags name the same commits upstream: the compare URL comes from them
    assert f"{REPO}/compare/v0.26.0...v0.27.0" in links(md)


def test_environment_block_and_symptom(contents: JournalContents) -> None:
    md = render_markdown(build_report(contents, STATE))
    env = md[md.index("### Environment"):]
    rows = {r[0][0]: r[1][0] for r in cells(env)}
    assert rows["GPU"] == "NVIDIA H200"
    assert rows["Driver"] == "570.86.15" and rows["Python"] == "3.12.3"
    assert rows["PyTorch"] == "2.11.0+cu130"  # listed under versions in this journal
    assert rows["Weights"].startswith("a random checkpoint shaped like Qwen/Qwen3-0.6B")


def test_json_has_the_same_facts_as_the_markdown(contents: JournalContents) -> None:
    report = build_report(contents, STATE)
    data = json.loads(render_json(report))
    assert data == json.loads(json.dumps(report))  # nothing lost or stringified
    md = render_markdown(report)
    assert len(lifetime_rows(md)) == len(data["lifetimes"])
    assert len(evidence_rows(md)) == len(data["tested"])
    a = data["answer"]
    assert a["flip_block"][0]["sha"] == sha(FLIP) and a["flip_block"][0]["pr"] == FIX_PR
    assert (a["confidence"], a["p_median"], a["p_interval"]) == (0.993, 0.55, [0.31, 0.78])
    assert data["posterior"] == list(posterior())
    assert data["controls"]["positive"]["verdict"] == "DIVERGENT"
    assert data["headline"]["words"].startswith("fixed in ")
    assert len(data["lifetimes"]) == len(LIFETIMES) + 1  # the repeated lifetime id counted once


def test_long_parts_are_folded_and_log_tails_are_quiet(contents: JournalContents) -> None:
    md = render_markdown(build_report(contents, STATE))
    first_screen = md[: md.index("<details>")]
    assert "Output:" not in first_screen and "Traceback" not in first_screen
    # two folds: every lifetime under the evidence, and the ending (how to reproduce ...)
    assert md.count("<details>") == 2 and md.rstrip().endswith("</details>")
    every = md[md.index("#### Every lifetime"):]
    assert "| all 10 repeat pairs |" not in every  # 5 repeats, 3 outputs: not every pair
    assert "no wheel for this commit and the source build failed" in md
    # A log tail holding ``` gets a longer fence, so it cannot end the code block early.
    fences = [t for t in parse(md) if t.type == "fence" and t.info == "text"]
    assert any("Traceback: boom" in t.content and "```" in t.content for t in fences)
    command = [t.content for t in parse(md) if t.type == "fence" and t.info == "sh"]
    assert command[0] == ("bisect start --good v0.27.0 --bad v0.26.0 --recipe batch-invariance "
                          "--env 'A=has space'\n")


def test_access_log_lines_leave_the_log_tail() -> None:
    from bisect_tool.report.evidence import quiet_log

    text = ('INFO engine config: max_num_seqs=64\n'
            '(APIServer pid=2711) INFO:     127.0.0.1:36066 - "POST /v1/completions HTTP/1.1" '
            '200 OK\nERROR boom')
    assert quiet_log(text) == "INFO engine config: max_num_seqs=64\nERROR boom"


def test_reproduce_lists_changed_recipe_values_and_one_lifetime(
    contents: JournalContents,
) -> None:
    bundled = {"name": "batch-invariance", "runtime": {"model": "Qwen/Qwen3-0.6B",
                                                       "env": {"VLLM_BATCH_INVARIANT": "1"}},
               "probe": {"kind": "server", "requests": 31, "fillers": 13, "repeats": 5,
                         "jitter_ms": 40.0, "target_coresidency": 0}}
    header = {**contents.header}
    header["recipe"] = {**header["recipe"], "runtime": {
        **header["recipe"]["runtime"], "server_module": "vllm.entrypoints.openai.api_server"}}
    report = build_report(journal.JournalContents(header, contents.entries), STATE,
                          bundled_recipe=bundled)
    md = render_markdown(report)
    toml = [t.content for t in parse(md) if t.type == "fence" and t.info == "toml"]
    assert toml and "target_coresidency = 44" in toml[0] and "requests" not in toml[0]
    sh = [t.content for t in parse(md) if t.type == "fence" and t.info == "sh"]
    assert any(c.startswith("VLLM_BATCH_INVARIANT=1 python -m vllm.entrypoints.openai."
                            "api_server --enforce-eager --max-num-seqs 64 --model "
                            "Qwen/Qwen3-0.6B --host 127.0.0.1 --port 8000") for c in sh)
    assert any("bisect probe --server http://127.0.0.1:8000" in c for c in sh)


def test_block_answer_lists_every_commit_like_git(contents: JournalContents) -> None:
    block = (sha(5), sha(6), sha(7))
    state = replace(STATE, flip_block=block, credible_set=block, confidence=0.991)
    md = render_markdown(build_report(contents, state))
    head = md[: md.index("### Changes")]
    assert "could be any of these 3 commits" in head
    assert "**99.1%**" in head
    tokens = MarkdownIt("commonmark").parse(head)
    items = [t for t in tokens if t.type == "list_item_open"]
    assert len(items) >= 3
    for i in (5, 6, 7):
        assert f"{REPO}/commit/{sha(i)}" in links(head)


@pytest.mark.parametrize(
    ("state", "phrase"),
    [
        ("budget_exhausted", "Inconclusive: budget exhausted"),
        ("no_candidate_left", "Inconclusive: no testable candidate left"),
        ("bad_end_never_reproduced", "never showed the bug in 3 lifetimes"),
        ("controls_failed", "CLEAN results are not trusted"),
        ("ends_contradict", "An end is not what it was said to be"),
        ("running", "Still running"),
    ],
)
def test_not_done_states_say_so_first(
    contents: JournalContents, state: str, phrase: str
) -> None:
    top3 = (sha(6), sha(7), sha(8))
    md = render_markdown(build_report(
        contents, replace(STATE, state=state, confidence=0.6, credible_set=top3)))
    first = first_paragraph(md)
    assert phrase in first
    assert not first.startswith("<p><strong>First good commit")
    assert not md.startswith("## Bisect result: fixed")  # no answer in words without one
    if state in ("budget_exhausted", "no_candidate_left"):
        assert "the 90% credible set is" in first
        assert all(f"{REPO}/commit/{s}" in first for s in top3)
    if state == "bad_end_never_reproduced":
        assert "v0.26.0" in first  # names the bad end as the user typed it
    if state == "budget_exhausted":
        assert "max_evaluations (13) reached" in first  # the journal's end message says why


def test_failed_positive_control_warns(tmp_path: Path, contents: JournalContents) -> None:
    path = tmp_path / journal.JOURNAL_NAME
    with Journal(path) as j:
        j.append(contents.header)
        failed = ControlsResult(server_result("p", 1, FULL), server_result("n", 1, FULL))
        j.append({"type": "controls", **failed.to_detail()})
    report = build_report(journal.read(path), replace(STATE, state="controls_failed"))
    md = render_markdown(report)
    assert "- Positive: the concurrent workload (31 requests + 13 fillers) with batch " \
        "invariance off: **CLEAN**" in md
    assert "[!WARNING]" in md
    assert "No lifetime ran." in md
    assert "positive control (invariance off) was clean" in first_paragraph(md)

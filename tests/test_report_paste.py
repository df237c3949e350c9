"""The report as a vLLM maintainer pastes it into issue #51187 (issue 32, items 1-5, 7, 9-11),
read on the GPU runs' own journals (docs/h200/) the way a reader checks it: the rendered
Markdown, parsed with markdown-it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gitrepos import run_cli
from markdown_it import MarkdownIt
from mdtables import rows

from bisect_tool import journal as journal_mod
from bisect_tool.report import CAP, build_report, render_markdown, render_report, text_plot
from bisect_tool.report.confidence import chance_of_clean_run, how_sure
from bisect_tool.values import Standing

ROOT = Path(__file__).resolve().parent.parent
RELEASES = ROOT / "docs" / "h200" / "releases" / "journal.jsonl"
SEED_RUN = ROOT / "docs" / "h200" / "2026-12-03" / "journal.jsonl"
LOCATE_TAIL = ROOT / "docs" / "h200" / "releases" / "locate.jsonl"


def report_of(path: Path) -> str:
    code, out, err = run_cli("report", "--journal", str(path))
    assert code == 0, err
    return out


def section(md: str, title: str) -> str:
    start = md.index(f"### {title}")
    end = md.find("\n### ", start + 1)
    return md[start: end if end > 0 else md.index("<details>", start)]


def lifetime_table(evidence: str) -> str:
    """The Evidence section's folded table of every lifetime (issue 41: folded, grouped)."""
    return evidence[evidence.index("<summary>Each lifetime"):]


def two_columns(md: str) -> dict[str, str]:
    return {r[0]: r[1] for r in rows(md)}


def with_entries(path: Path, tmp_path: Path, *extra: Mapping[str, Any],
                 header: Mapping[str, Any] | None = None) -> Path:
    """A copy of a committed journal with entries added before its end (or header changes)."""
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    if header:
        lines[0] = {**lines[0], **header}
    end = [e for e in lines if e["type"] == "end"]
    body = [e for e in lines if e["type"] != "end"]
    out = tmp_path / path.name
    out.write_text("".join(json.dumps(e) + "\n" for e in [*body, *extra, *end]))
    return out


# -- item 1: how sure ---------------------------------------------------------------------------


def test_how_sure_shows_the_lifetimes_alone_beside_the_op_checks_prior() -> None:
    """The release run stopped at 99.6% with one clean lifetime of v0.27.0: the lifetimes alone
    give 96.0% (97.7% before issue 38's check of the good side), below the 99.5% it stops at;
    the rest is the op check's prior. Both are on top, with the chance a still-buggy v0.27.0
    gives that one clean lifetime."""
    md = report_of(RELEASES)
    top = md[: md.index("###")]
    assert ("- How sure: 96.0% from the server lifetimes alone, 99.6% with the op check's "
            "narrowing (the run stops at 99.5%); were v0.27.0 still buggy, 1 clean lifetime "
            "would happen 10.3% of the time") in top
    sure = two_columns(section(md, "How sure"))
    assert sure["From the server lifetimes alone"] == "96.0%"
    assert sure["With the op check's narrowing"].startswith("99.6%")
    assert "50.0% before them, 81.3% after" in sure["With the op check's narrowing"]
    assert sure["Were v0.27.0 still buggy: 1 clean lifetime"].startswith(
        "10.3% of the time, with p from the bad side's 3 of 3 divergent")
    assert sure["q: a lifetime without the bug shows it anyway"] == (
        # two significant digits below a tenth (issue 41: 0.0063 was printed 0.01)
        "0.0063 [0.0013, 0.039] (median [90% interval]), from 0 of 1 lifetime on the good side "
        "and the prior Beta(0.5, 50)")
    # "these alone carry the answer" is gone: it was false here
    assert "alone carry the answer" not in md


def test_the_chance_of_a_clean_run_is_what_a_reader_integrates() -> None:
    """E[(1 - p)^k] under p's posterior (20% at p = 1, else Beta(2, 1)) after d of t divergent,
    integrated numerically here: the report's number is checkable by hand."""
    def integrated(d: int, t: int, k: int) -> float:
        n = 200_000
        xs = [(i + 0.5) / n for i in range(n)]
        beta = [2 * x * x ** d * (1 - x) ** (t - d) for x in xs]  # Beta(2, 1) prior x likelihood
        z_beta = sum(beta) / n
        z = 0.8 * z_beta + 0.2 * (1.0 if d == t else 0.0)
        return 0.8 * sum(b * (1 - x) ** k for b, x in zip(beta, xs, strict=True)) / n / z

    for d, t, k in ((3, 3, 1), (3, 3, 2), (3, 4, 14), (1, 2, 3)):
        assert math.isclose(chance_of_clean_run(d, t, k), integrated(d, t, k), rel_tol=1e-3)
    assert math.isclose(chance_of_clean_run(3, 3, 1), 0.8 * 0.4 / 0.52 / 6)  # 10.3%


def test_q_without_a_good_side_lifetime_is_said_to_be_its_prior() -> None:
    answer = {"state": "done", "direction": "fix", "flip_block": [{"index": 1}],
              "confidence": 0.995, "q_median": 0.01, "q_interval": [0.0, 0.04],
              "p_median": 0.9, "p_interval": [0.5, 1.0]}
    tested = [{"index": 0, "name": "v0.26.0", "divergent": 3, "clean": 0}]
    sure = how_sure(answer, tested, None, None, {"confidence": 0.99},
                    {"p_has_data": True, "q_has_data": False})
    assert not sure["q"]["measured"] and sure["chance_clean_if_buggy"] is None
    state = Standing("done", "fix", ("b",), 0.995, ("b",), 0.9, (0.5, 1.0), 0.01,
                        (0.0, 0.04), 3, 1, (0.0, 0.995))
    contents = journal_mod.JournalContents(
        {"candidates": [{"sha": "a", "tags": ["v1.0.0"]}, {"sha": "b", "tags": ["v1.1.0"]}],
         "direction": "fix", "recipe": {"probe": {"kind": "server"}}},
        ({"type": "observation", "lifetime_id": "a-0", "commit": "a", "position": 0,
          "verdict": "divergent", "detail": {}},), None)
    md = render_markdown(build_report(contents, state))
    assert two_columns(section(md, "How sure"))[
        "q: a lifetime without the bug shows it anyway"] == (
        "its prior alone, Beta(0.5, 50): no lifetime on the good side")


# -- item 2: reproduce --------------------------------------------------------------------------


def test_reproduce_makes_the_random_checkpoint_and_swaps_each_file_with_no_local_path() -> None:
    md = report_of(RELEASES)
    fences = [t.content for t in MarkdownIt("commonmark").parse(md) if t.type == "fence"]
    sh = "\n".join(f for f in fences)
    assert ("bisect model random --config models/qwen3-0.6b --out qwen3-0.6b-random --dtype "
            "float16 --seed 0") in sh
    assert "this run did not record the transformers and torch that made its checkpoint" in md
    assert "pip install vllm==0.26.0" in sh  # the pinned Python side the run used
    assert ("pip download --no-deps --only-binary=:all: vllm==0.27.0 -d wheels\n"
            'unzip -o wheels/vllm-0.27.0-*.whl vllm/_C_stable_libtorch.abi3.so -d "$SITE"\n'
            'echo "d60a4547504db80b5307bfa4d146c5e3278f95add4ccf585b7ed9570b41741f5  '
            '$SITE/vllm/_C_stable_libtorch.abi3.so" | sha256sum -c') in sh
    assert "--model qwen3-0.6b-random --host 127.0.0.1 --port 8000" in sh
    assert "vllm serve Qwen/Qwen3-0.6B" not in md  # the published weights were never loaded
    assert ("bisect start --releases --good 0.27.0 --bad 0.24.0 --recipe "
            "batch-invariance-h200.toml\n") in fences
    for local in ("/tmp/", "/work/", "--state-dir", " -v"):
        assert local not in sh, local
    # the recipe's changes, a URL kept, the machine's own folders left out by name
    toml = next(t.content for t in MarkdownIt("commonmark").parse(md) if t.info == "toml")
    assert 'index_url = "https://pypi.org/simple"' in toml and "pinned_package_dir" not in toml
    assert "Left out, as they name the run's own folders: `runtime.pinned_package_dir`." in md
    # the journal says 0+unknown (a source tree, before the version came from pyproject.toml)
    assert "bisect, version not recorded" in md and "0+unknown" not in md


def test_a_recorded_checkpoint_and_tool_version_are_named(tmp_path: Path) -> None:
    env = {"type": "environment", "weights": {
        "seed": 0, "dtype": "float16", "torch": "2.11.0+cu130", "transformers": "4.57.1",
        "config_sha256": "ab" * 32}}
    path = with_entries(SEED_RUN, tmp_path, env, header={"tool_version": "0.1.0+g1e7b60a"})
    md = report_of(path)
    assert ("this run's was made with transformers 4.57.1 and torch 2.11.0+cu130" in md)
    assert "Reproduce, and every lifetime in detail (bisect 0.1.0+g1e7b60a)" in md
    env_rows = two_columns(section(md, "Environment"))
    assert env_rows["Weights"].endswith("seed 0, float16, made with transformers 4.57.1 and "
                                        "torch 2.11.0+cu130")


# -- item 3: differences from the reported setup ------------------------------------------------


def test_differences_from_the_reported_setup_are_flagged() -> None:
    md = report_of(RELEASES)
    top = md[: md.index("###")]
    assert ("- Not as reported in vLLM #51187: GPU, model, `VLLM_USE_FLASHINFER_SAMPLER=0`, "
            "server arguments, arrival of requests; not recorded or not checked by this run: "
            "FlashInfer version, compiled files of vllm (see Environment)"
            ).replace("#", "\\#") in top
    env = section(md, "Environment")
    table = rows(env[env.index("Differences from the setup"):])
    by = {r[0]: (r[1], r[2]) for r in table}
    assert by["VLLM_USE_FLASHINFER_SAMPLER"] == ("unset", "0")
    assert by["flashinfer"] == ("0.6.14", "not recorded by this run")
    assert by["Arrival of requests"] == ("all at once", "0-40 ms of random delay per request")
    assert by["Server arguments"] == (
        "--gpu-memory-utilization 0.55",
        "--dtype float16 --no-enable-prefix-caching --skip-tokenizer-init")
    assert by["Compiled files of vllm"] == ("all of the wheel's", "not recorded by this run")
    assert by["GPU"][1] == "NVIDIA H200 (compute capability 9.0)"
    assert "PyTorch" not in by and "torch" not in by  # 2.11.0+cu130 as reported


def test_a_stack_without_flashinfer_and_extensions_says_so(tmp_path: Path) -> None:
    """A run of today's tool records what the pinned install lacks: FlashInfer absent is "not
    installed", not unknown, and the compiled files left out are named."""
    env = {"type": "environment", "missing_extensions": [
        "vllm/_moe_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"],
        "transformers": "4.57.1"}
    lines = [json.loads(x) for x in SEED_RUN.read_text().splitlines()]
    recipe = lines[0]["recipe"]
    recipe["probe"] = {**recipe["probe"], "requests": 32, "jitter_ms": 0.0}
    md = report_of(with_entries(SEED_RUN, tmp_path, env, header={"recipe": recipe}))
    env_md = section(md, "Environment")
    by = {r[0]: (r[1], r[2]) for r in rows(env_md[env_md.index("Differences from the"):])}
    assert by["flashinfer"] == ("0.6.14", "not installed")
    assert by["Compiled files of vllm"] == (
        "all of the wheel's",
        "without vllm/_moe_C.abi3.so, vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")
    assert by["Workload"] == ("31 requests + 13 fillers", "32 requests + 13 fillers")
    assert "Arrival of requests" not in by  # all at once, as reported


# -- item 4: the evidence's columns -------------------------------------------------------------


def test_first_position_first_token_and_the_delta_before_the_tokens_diverge() -> None:
    """vllm-0.26.0-0 of the release run: a logprob differs at position 0, a token at 10; its
    recorded 0.354 compares positions after the divergence, so it is left out and said so."""
    md = report_of(RELEASES)
    evidence = section(md, "Evidence")
    tokens = MarkdownIt("commonmark").enable("table").parse(lifetime_table(evidence))
    start = next(i for i, t in enumerate(tokens) if t.type == "thead_open")
    head = [t.content for t in tokens[start:] if t.type == "inline"][:9]
    assert head[5:8] == ["Max |Δ logprob| up to the first differing token",
                         "First position that differs", "First token that differs"]
    table = rows(lifetime_table(evidence))
    first = table[0]
    assert first[1] == "#0" and first[5] == "-†" and first[6] == "0" and first[7] == "10"
    assert first[8] == "tokens"
    assert table[1][5] == "3.921e-03" and table[1][7] == "-"  # logprobs only: comparable
    assert "(v0.26.0 #0: 3.539e-01)" in evidence and "3.539e-01 |" not in evidence


def test_a_delta_measured_up_to_the_divergence_is_shown_even_when_tokens_moved(
    tmp_path: Path,
) -> None:
    lines = [json.loads(x) for x in RELEASES.read_text().splitlines()]
    for e in lines:
        if e.get("lifetime_id") == "vllm-0.26.0-0":
            e["detail"]["max_abs_logprob_delta"] = 0.00390625
            e["detail"]["max_abs_logprob_delta_scope"] = "up_to_first_token_divergence"
    path = tmp_path / "j.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    first = rows(lifetime_table(section(report_of(path), "Evidence")))[0]
    assert first[5] == "3.906e-03" and first[7] == "10"


# -- item 5: controls ---------------------------------------------------------------------------


def test_the_controls_say_where_they_ran() -> None:
    controls = section(report_of(RELEASES), "Controls")
    assert ("Run on `v0.27.0` under v0.26.0's Python, in one lifetime booted with "
            "`VLLM_BATCH_INVARIANT=0` (and `VLLM_USE_FLASHINFER_SAMPLER=0`, as every lifetime)"
            ) in controls
    assert ("- Positive: the concurrent workload (31 requests + 13 fillers) with batch "
            "invariance off: **DIVERGENT**, 5 distinct outputs in 5 repeats, all 10 repeat "
            "pairs differ, co-residency 44, tokens first differ at position 13") in controls
    assert ("- Negative: the same requests one at a time: **CLEAN**, 5 repeats bitwise "
            "identical, co-residency 1") in controls


# -- item 7: the gate ---------------------------------------------------------------------------


def test_the_gate_says_what_it_compared_and_names_every_rejected_op(tmp_path: Path) -> None:
    md = report_of(RELEASES)
    op = section(md, "The op check")
    table = {r[0]: r for r in rows(op)}
    assert table["v0.24.0"][4] == ("rejects it: _C::fused_minimax_m3_qknorm_rope_kv_insert and "
                                   "3 more this run did not name")
    assert table["v0.27.0"][4] == "loads it"
    assert "compared every op the pinned `_C_stable_libtorch.abi3.so` registers" in op
    assert op.count("### The op check") == 1 and "### Tiers" not in md  # one section
    # the whole verdict, schemas and all, in the folded block
    assert "v0.24.0: candidate v0.24.0: vllm/_C_stable_libtorch.abi3.so: op" in md
    # today's gate names them all; and a recipe's gate_ops are listed
    lines = [json.loads(x) for x in RELEASES.read_text().splitlines()]
    lines[0]["recipe"]["runtime"]["gate_ops"] = ["rms_norm", "fused_add_rms_norm"]
    for e in lines:
        if e.get("lifetime_id") == "vllm-0.24.0-narrow-0":
            e["detail"]["gate"] = (
                "candidate vllm-0.24.0: vllm/_C_stable_libtorch.abi3.so: candidate lacks op "
                "_C::rms_norm (and 2 more: _C::fused_add_rms_norm, _C::silu_and_mul (missing))")
    path = tmp_path / "j.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    op = section(report_of(path), "The op check")
    assert {r[0]: r for r in rows(op)}["v0.24.0"][4] == (
        "rejects it: _C::rms_norm, _C::fused_add_rms_norm, _C::silu_and_mul (missing)")
    assert "compared the ops in `[runtime] gate_ops` (`rms_norm`, `fused_add_rms_norm`)" in op


# -- item 9: size cap ---------------------------------------------------------------------------


def test_a_report_too_long_for_github_points_at_the_json(tmp_path: Path) -> None:
    """800 lifetimes with long log tails: the Markdown stays under GitHub's 65,536 characters,
    the details go to the JSON report, which keeps every lifetime."""
    lines = [json.loads(x) for x in SEED_RUN.read_text().splitlines()]
    template = next(e for e in lines if e.get("lifetime_id") == "a2e5051fcc1f-0")
    end = lines.pop()
    for n in range(800):
        lines.append({**template, "lifetime_id": f"a2e5051fcc1f-{100 + n}",
                      "detail": {**template["detail"], "log_tail": "x" * 2000}})
    lines.append(end)
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    md = render_report(path)
    assert len(md) < CAP
    assert "Every lifetime in detail is in the JSON report" in md
    assert "and 655 more lifetimes: every one is in the JSON report" in md
    assert len(json.loads(render_report(path, "json"))["lifetimes"]) == 805


# -- item 10: replay, the plot ------------------------------------------------------------------


def test_replay_prints_its_answer_and_the_report_command_on_lines_of_their_own() -> None:
    done = subprocess.run([sys.executable, "-m", "bisect_tool", "replay", str(RELEASES)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "first good release: v0.27.0 (confidence 99.6%, 4 lifetimes)",
        f"the full report: bisect report --journal {RELEASES}"]


def test_the_plot_shows_the_op_check_and_names_the_candidates(tmp_path: Path) -> None:
    contents = journal_mod.read(RELEASES)
    from bisect_tool.designs import ledger

    report = build_report(contents, ledger.replay(contents).standing())
    plot = text_plot(report)
    lines = plot.splitlines()
    assert lines[1].startswith("lifetimes |") and lines[2].startswith("op check  |")
    # v0.24.0, v0.25.1 and v0.26.0 differ between launch sizes, v0.27.0 does not; v0.25.0
    # was never checked
    assert lines[2][lines[2].index("|") + 1: lines[2].rindex("|")] == "X XXo"
    assert lines[1][lines[1].index("|") + 1: lines[1].rindex("|")] == "   Xo"
    assert "^v0.24.0 (old end)" in plot and "v0.27.0 (new end)^" in plot
    from bisect_tool.report import plot_posterior

    png = plot_posterior(report, tmp_path / "p.png")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"


# -- item 11: a run that ends without an answer ---------------------------------------------------


def test_controls_that_could_not_run_are_one_line_with_the_log_named(tmp_path: Path) -> None:
    """Controls on a release the pinned stack cannot boot: the server's traceback (40 lines)
    appears nowhere in the report, the first error does, once at the top."""
    tail = next(json.loads(x) for x in LOCATE_TAIL.read_text().splitlines()
                if '"locate-good-py-good-c-0"' in x)["message"]
    failed = {"verdict": "untestable", "message": f"boot failed: {tail}", "detail": {}}
    problem = f"the controls could not run: boot failed: {tail}"
    lines = [json.loads(x) for x in SEED_RUN.read_text().splitlines()][:2]
    lines.append({"type": "controls", "commit": lines[0]["candidates"][1]["sha"], "ok": False,
                  "problem": problem, "positive": failed, "negative": failed, "attempts": 1})
    lines.append({"type": "end", "state": "controls_failed",
                  "message": f"controls failed, so a CLEAN would mean nothing: {problem}"})
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    md = report_of(path)
    for noise in ("Traceback", 'File "', "pid=", "uvloop", "For further information"):
        assert noise not in md, noise
    first = md.split("\n\n")[1]
    assert first.startswith("**Controls failed**: the controls could not run: boot failed: "
                            "lifetime locate-good-py-good-c-0: server exited with code 1 before "
                            "/health: ValidationError")
    assert md.count("failed to be inspected") <= 3  # the top, and each control's one line


def test_every_committed_journal_has_no_run_on_message() -> None:
    """A one-line message stays one line in every report (a tail never reaches a table cell)."""
    for path in sorted((ROOT / "docs").rglob("*.jsonl")):
        md = render_report(path)
        for line in md.splitlines():
            if line.startswith("|"):
                assert "\\n" not in line and len(line) < 2000, (path, line[:200])


def test_an_end_that_could_not_run_is_named_as_the_report_names_it() -> None:
    """The journal's end message spells the release vllm-0.24.0; the report spells it once."""
    path = ROOT / "docs" / "h200" / "releases" / "attempt1-two-servers-per-gpu.jsonl"
    first = report_of(path).split("\n\n")[1]
    assert first == ("**An end is untestable**: the bad end v0.24.0 is untestable and so is "
                     "every candidate next to it; pick another --bad.")


def test_messages_shown_name_no_folder_of_the_machine_that_ran() -> None:
    """A build's failure names its log under the state dir; the report names it as the state
    dir does, and a URL stays whole."""
    from bisect_tool.report.names import no_local_paths

    assert no_local_paths("build failed (exit 1); log /tmp/p/demo/state/logs/build-ab12.log") \
        == "build failed (exit 1); log logs/build-ab12.log"
    assert no_local_paths("no local path /home/me/y.so; 404 https://wheels.vllm.ai/abc/") \
        == "no local path y.so; 404 https://wheels.vllm.ai/abc/"
    assert no_local_paths("16/16 rows, h4096") == "16/16 rows, h4096"
    # a CI runner's checkout sits wherever its runner puts it (CI's stop 35 ran under a folder
    # the old list of prefixes did not name, and its report printed the whole path)
    assert no_local_paths("3.11.7 (the tool's own, /builds/ci-7/main/.venv/bin/python)") \
        == "3.11.7 (the tool's own, python)"
    route = '"POST /v1/completions HTTP/1.1" 200'
    assert no_local_paths(route) == route


def test_status_and_log_spell_releases_as_the_report_does(tmp_path: Path) -> None:
    """One spelling of a release on screen and in the report (issue 32, item 9): v0.27.0."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.jsonl").write_bytes(RELEASES.read_bytes())
    def show(command: str) -> str:
        done = subprocess.run([sys.executable, "-m", "bisect_tool", command, "--state-dir",
                               str(state)], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout

    status = show("status")
    assert "top candidate: v0.27.0 at 99.6%" in status and "vllm-0." not in status, status
    # the log's second column names the candidate (the first is the lifetime's id)
    names = {line.split()[1] for line in show("log").splitlines()
             if line.startswith("vllm-0.")}
    assert names and all(n.startswith("v0.") for n in names), names


def test_the_environment_names_the_interpreter_without_this_machines_directories() -> None:
    """Which interpreter ran is in the report (issue 30), where it sits on this machine is not
    (issue 32, item 2: a pasted report names no machine-local path)."""
    from bisect_tool.report.environment import block

    env = {"python": "3.12.3 (the tool's own, /home/me/work/.venv/bin/python3)"}
    rows = dict(block(env, {}, []))
    assert rows["Python"] == "3.12.3 (the tool's own, python3)"
    env = {"python": "unknown (/opt/py/bin/python3.12 did not answer)"}
    assert dict(block(env, {}, []))["Python"] == "unknown (python3.12 did not answer)"

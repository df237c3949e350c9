"""The server probe's other comparisons and what it reports apart (issue 40): vLLM's own
definition (``[probe] mode = "bs1-vs-bsN"``), the first requests after start-up
(``warmup_requests``, vLLM #33537) and prefix caching cold against warm (``prefix_cache_check``,
#40896, #42019), all against real demollm servers: the fixed kernel with the invariance switch
on is batch-invariant, so whatever the probe reports there comes from the switch under test.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from bisect_tool.demo.calibrate import demo_server
from bisect_tool.demo.history import generate
from bisect_tool.demo.pinned import ensure_pinned_build, run_build
from bisect_tool.interfaces import ServerHandle
from bisect_tool.probes.batch_sizes import (
    BatchSizeProbe,
    batch_verdict,
    compare_pass,
    server_probe,
)
from bisect_tool.probes.compare import Sample
from bisect_tool.probes.render import render_server_detail
from bisect_tool.probes.server import ServerDeterminismProbe
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict

BI = {"VLLM_BATCH_INVARIANT": "1"}
# The engine's default device clock (20 ms + 0.05 ms/token a step): long enough for the 20 ms
# /metrics poll to see a batch; the batches form from the arrivals alone (all at once here).
FAST: tuple[str, ...] = ()
EAGER = ("--enforce-eager",)

# 12 short prompts: even all of them prefilled in one step stay below 256 tokens, so the
# pinned kernel is batch-invariant too; the sampler tiles from 8 rows a step on.
SETTINGS = ProbeSettings(
    requests=10, fillers=2, prefix_tokens=4, prompt_tokens=8, filler_tokens=8,
    vocab_size=2048, repeats=2, max_tokens=6, logprobs=2, jitter_ms=0.0,
    target_coresidency=1, request_timeout_s=30.0,
)
BS1 = dataclasses.replace(SETTINGS, mode="bs1-vs-bsN")


@pytest.fixture(scope="module")
def fixed_kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v0.27.0's kernel (the fix pins the block size under the switch)."""
    root = tmp_path_factory.mktemp("probe-modes")
    history = generate(root / "repo", commits=80)
    tree = root / "fixed"
    subprocess.run(
        ["git", "-C", str(history.repo), "worktree", "add", "-q", str(tree), history.good_tag],
        check=True,
    )
    return run_build(tree)


def probe(url: str, settings: ProbeSettings, sequential: bool = False):  # type: ignore[no-untyped-def]
    return server_probe(settings, sequential=sequential).run(
        ServerHandle(url, "t", Path(os.devnull)))


# ---- bs1-vs-bsN --------------------------------------------------------------------------------


def test_bs1_vs_bsn_is_clean_on_a_batch_invariant_engine(fixed_kernel: Path) -> None:
    with demo_server(fixed_kernel, BI, EAGER) as url:
        result = probe(url, BS1)
    assert result.verdict is Verdict.CLEAN, result.message
    d = result.detail
    assert d["comparison"] == "bs1-vs-bsN" and d["batch_sizes"] == [12]
    assert [p["batch_size"] for p in d["batch_passes"]] == [12, 12]
    assert d["differing_prompts"] == [] and d["max_coresidency"] >= 2
    assert "each prompt alone vs in batches of 12" in render_server_detail(d)


@pytest.mark.slow  # three probes of a real demo server
def test_bs1_vs_bsn_catches_the_sampler_that_the_repeats_probe_misses(
    fixed_kernel: Path,
) -> None:
    """With the FlashInfer-like sampler on, a batch of 12 arriving at once forms the same
    (>= 8-row) steps every repeat: the repeats agree with each other, so #51187's probe calls
    the lifetime clean, while each prompt alone answers differently: vLLM's definition sees it."""
    with demo_server(fixed_kernel, {**BI, "VLLM_USE_FLASHINFER_SAMPLER": "1"}, EAGER) as url:
        bs1 = probe(url, BS1)
        repeats = probe(url, SETTINGS)
        negative = probe(url, BS1, sequential=True)
    assert bs1.verdict is Verdict.DIVERGENT, bs1.message
    assert "answered differently alone and in a batch" in bs1.message
    assert "only logprobs moved" in bs1.message and bs1.detail["logprobs_only"]
    # most rows: the tiled and the whole-vocabulary sums round alike for some
    assert len(bs1.detail["differing_prompts"]) >= 6
    assert repeats.verdict is Verdict.CLEAN, repeats.message
    # one request at a time, the "batches" are the prompts alone: the negative control holds
    assert negative.verdict is Verdict.CLEAN, negative.message


@pytest.mark.slow  # a real demo server, two batch sizes
def test_needles_compare_only_the_first_prompts_of_each_batch_size(fixed_kernel: Path) -> None:
    """Issue 43's needle: a few requests alone against themselves in batches of two sizes
    (vLLM's TP test has one needle in batches of 17 and 65)."""
    needle = dataclasses.replace(BS1, batch_sizes=(4, 12), needles=3)
    with demo_server(fixed_kernel, {**BI, "VLLM_USE_FLASHINFER_SAMPLER": "1"}, EAGER) as url:
        result = probe(url, needle)
    assert result.verdict is Verdict.DIVERGENT, result.message
    passes = result.detail["batch_passes"]
    assert [p["batch_size"] for p in passes] == [4, 4, 12, 12]
    # 4 rows a step: not tiled, the needles answer as alone; 12: tiled, they do not
    assert [p["differing_prompts"] for p in passes[:2]] == [[], []]
    for p in passes[2:]:
        assert p["differing_prompts"] and set(p["differing_prompts"]) <= {0, 1, 2}
    assert result.detail["needles"] == 3


def test_the_batch_comparison_as_plain_values() -> None:
    a = Sample((1, 2), (-0.5, -0.25), ())
    b = Sample((1, 2), (-0.5, -0.2500001), ())
    c = Sample((1, 3), (-0.5, -0.9), ())
    same = compare_pass(3, 0, [a, a, a], [a, a, a], 3, 3)
    moved = compare_pass(3, 1, [a, a, a], [a, b, c], 2, 3)  # prompt 2 is not compared
    assert same.differing == () and moved.differing == (1,)
    assert not moved.tokens_moved and moved.first_position == 1
    assert batch_verdict([same], lambda n: n)[0] is Verdict.CLEAN
    verdict, message = batch_verdict([same, moved], lambda n: n)
    assert verdict is Verdict.DIVERGENT and "batch 3 pass 1: 1" in message
    short = compare_pass(3, 0, [a, a, a], [a, a, a], 3, 2)
    verdict, message = batch_verdict([short], lambda n: n)
    assert verdict is Verdict.INCONCLUSIVE and "2 of 3" in message
    assert batch_verdict([short], lambda n: 0)[0] is Verdict.CLEAN  # sequential: no target
    tokens = compare_pass(3, 0, [a, a, a], [c, a, a], 3, 3)
    assert tokens.tokens_moved and tokens.first_token_position == 1


def test_the_recipe_mode_picks_the_probe() -> None:
    assert isinstance(server_probe(BS1), BatchSizeProbe)
    assert type(server_probe(SETTINGS)) is ServerDeterminismProbe


# ---- reported apart: warm-up, prefix caching ---------------------------------------------------


@pytest.mark.slow  # real demo servers, one compiled
def test_a_compiled_servers_warm_up_is_reported_apart_not_as_the_bug(fixed_kernel: Path) -> None:
    warm = dataclasses.replace(SETTINGS, warmup_requests=2)
    with demo_server(fixed_kernel, BI, FAST) as url:  # CUDA graphs on: no --enforce-eager
        result = probe(url, warm)
    assert result.verdict is Verdict.CLEAN, result.message
    w = result.detail["warmup"]
    assert w["requests"] == 2 and w["differing"] == [0]  # the first request after start only
    assert "reported apart, not counted" in result.message and "#33537" in result.message
    assert "1 of 2 differed from themselves later" in render_server_detail(result.detail)
    with demo_server(fixed_kernel, BI, EAGER) as url:
        eager = probe(url, warm)
    assert eager.detail["warmup"]["differing"] == [] and "warm-up" not in eager.message


@pytest.mark.slow  # a real demo server
def test_without_warm_up_requests_bs1_vs_bsn_still_discards_the_warm_up(
    fixed_kernel: Path,
) -> None:
    # The priming batch takes the JIT path's steps: the prompts alone come after it.
    with demo_server(fixed_kernel, BI, FAST) as url:
        result = probe(url, BS1)
    assert result.verdict is Verdict.CLEAN, result.message
    assert "warmup" not in result.detail


@pytest.mark.slow  # a real demo server, probed cold and warm
def test_prefix_caching_cold_and_warm_are_reported_apart(fixed_kernel: Path) -> None:
    check = dataclasses.replace(SETTINGS, prefix_tokens=16, prompt_tokens=24,
                                prefix_cache_check=True)
    with demo_server(fixed_kernel, BI, (*EAGER, "--enable-prefix-caching")) as url:
        cached = probe(url, check)
    with demo_server(fixed_kernel, BI, EAGER) as url:
        plain = probe(url, check)
    # the repeats all start from the blocks the priming pass cached: they agree
    assert cached.verdict is Verdict.CLEAN, cached.message
    c = cached.detail["prefix_cache"]
    assert c["differs"] and c["hit_tokens"] == 32 and c["prompt_tokens"] == 40
    assert "prefix caching" in cached.message and "not counted" in cached.message
    assert "differs, 32 tokens from the cache" in render_server_detail(cached.detail)
    p = plain.detail["prefix_cache"]
    assert not p["differs"] and p["hit_tokens"] == 0
    assert "(prefix caching off)" in render_server_detail(plain.detail)


@pytest.mark.slow  # a real demo server on its own build
def test_the_pinned_kernel_diverges_alone_vs_in_a_big_batch() -> None:
    """v0.26.0's kernel under bs1-vs-bsN: a batch whose prefill step crosses 256 tokens."""
    big = dataclasses.replace(BS1, requests=12, fillers=0, prefix_tokens=16, prompt_tokens=16)
    with demo_server(ensure_pinned_build(), BI, EAGER) as url:
        result = probe(url, big)
    assert result.verdict is Verdict.DIVERGENT, result.message


# ---- suspects: which setting shows the divergence ----------------------------------------------


def test_suspect_findings_as_plain_values() -> None:
    from bisect_tool.interfaces import ProbeResult
    from bisect_tool.probes.controls import suspect_findings, suspect_values

    assert suspect_values({"A": "0, 1", "B": "x"}) == [("A", "0"), ("A", "1"), ("B", "x")]
    clean, bad = ProbeResult(Verdict.CLEAN, {}, ""), ProbeResult(Verdict.DIVERGENT, {}, "")
    odd = ProbeResult(Verdict.INCONCLUSIVE, {}, "")
    found = suspect_findings({"A=0": [clean, clean], "A=1": [bad, odd]}, {"A": "0"}, "v0.27.0")
    assert [s["divergent"] for s in found["settings"]] == [0, 1]  # type: ignore[index]
    (words,) = found["findings"]  # type: ignore[misc]
    assert "A=0 (the setting this run used): divergent in 0 of 2" in words
    assert "A=1: divergent in 1 of 1 conclusive" in words
    assert "on v0.27.0 only A=1 shows divergence" in words and "this run used A=0" in words
    both = suspect_findings({"A=0": [bad], "A=1": [bad]}, {}, "v0.26.0")["findings"]
    assert "every value shows divergence: A is not what carries it" in str(both)
    assert "this run left A unset" in str(both)


@pytest.mark.slow  # a whole `bisect probe --controls` on the demo history: builds and real servers
def test_the_controls_say_which_sampler_setting_shows_divergence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bisect probe --commit v0.27.0 --controls` on the demo with [probe.suspects]: the fixed
    kernel stays clean with the sampler off (the recipe's setting) and diverges with it on."""
    from bisect_tool.cli import main
    from bisect_tool.demo import pinned
    from bisect_tool.demo.cli import write_recipe

    pinned.ensure_pinned_build()
    history = generate(tmp_path / "repo", commits=80)
    recipe = write_recipe(tmp_path / "demo.toml", tmp_path / "cache")
    text = recipe.read_text().replace(
        "[runtime.env]\n", '[runtime.env]\nVLLM_USE_FLASHINFER_SAMPLER = "0"\n')
    recipe.write_text(text + '\n[probe.suspects]\nVLLM_USE_FLASHINFER_SAMPLER = "0,1"\n')
    argv = ["probe", "--commit", history.good_tag, "--recipe", str(recipe), "--repo",
            str(history.repo), "--lifetimes", "0", "--controls", "--state-dir",
            str(tmp_path / "state")]
    with pytest.raises(SystemExit):
        main(argv)
    out = capsys.readouterr().out
    assert "== suspect VLLM_USE_FLASHINFER_SAMPLER=0" in out
    assert ("suspects: VLLM_USE_FLASHINFER_SAMPLER=0 (the setting this run used): divergent in "
            "0 of 2") in out
    assert "only VLLM_USE_FLASHINFER_SAMPLER=1 shows divergence" in out, out[-3000:]


def test_the_report_names_which_setting_showed_divergence(tmp_path: Path) -> None:
    from test_report import FULL, STATE, server_result, write_journal

    from bisect_tool import journal
    from bisect_tool.interfaces import ProbeResult
    from bisect_tool.journal import Journal
    from bisect_tool.probes.controls import ControlsResult, suspect_findings
    from bisect_tool.report import build_report, render_json, render_markdown

    first = tmp_path / "first.jsonl"
    write_journal(first)
    contents = journal.read(first)
    clean, bad = ProbeResult(Verdict.CLEAN, {}, ""), ProbeResult(Verdict.DIVERGENT, {}, "")
    found = suspect_findings({"VLLM_USE_FLASHINFER_SAMPLER=0": [clean, clean],
                              "VLLM_USE_FLASHINFER_SAMPLER=1": [bad, bad]},
                             {"VLLM_USE_FLASHINFER_SAMPLER": "0"}, "v0.27.0")
    path = tmp_path / journal.JOURNAL_NAME
    with Journal(path) as j:
        j.append(contents.header)
        held = ControlsResult(server_result("p", 3, FULL), ProbeResult(
            Verdict.CLEAN, server_result("n", 1, FULL).detail, "sequential"))
        j.append({"type": "controls", **held.to_detail(), "suspects": found})
    report = build_report(journal.read(path), STATE)
    line = next(x for x in render_markdown(report).splitlines() if "- Suspect" in x)
    plain = line.replace("\\", "")  # Markdown escapes
    assert plain.startswith("- Suspect, with batch invariance as every lifetime had it: "
                            "VLLM_USE_FLASHINFER_SAMPLER=0 (the setting this run used): "
                            "divergent in 0 of 2")
    assert "only VLLM_USE_FLASHINFER_SAMPLER=1 shows divergence" in plain
    assert "only VLLM_USE_FLASHINFER_SAMPLER=1" in render_json(report)

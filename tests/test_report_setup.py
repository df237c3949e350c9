"""The report a maintainer pastes, issue 41: what the issue reported read from the bundled recipe
(the sampler row), the compiled files checked against the wheel's own file list (or "not
checked"), the attention backend the server chose, a "Reproduce by hand" that rebuilds the run's
own stack, a run with no answer naming its one cause once, the evidence folded with its results
first, the gate's op lists whole, and nothing of the machine that ran it. Read on the GPU runs'
own journals (docs/) and on journals of real runs made here."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from gitrepos import linear, run_cli
from mdtables import rows

from bisect_tool.report.environment import compiled_files
from bisect_tool.runtime.common import attention_backend

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "docs" / "bench" / "gpu-2026-12-07-h100" / "journal-nonarrow.jsonl"
BUNDLED = ROOT / "bisect_tool" / "recipes" / "batch-invariance.toml"


def report_of(path: Path, *flags: str) -> str:
    code, out, err = run_cli("report", "--journal", str(path), *flags)
    assert code == 0, err
    return out


def section(md: str, title: str) -> str:
    start = md.index(f"### {title}")
    end = md.find("\n### ", start + 1)
    return md[start: end if end > 0 else md.index("<details>", start)]


# -- what the issue reported: the bundled recipe's, and a run that changed it flagged ------------


def test_the_sampler_setting_is_a_difference_and_a_changed_reported_table_is_flagged() -> None:
    """The H100 script's sed wrote VLLM_USE_FLASHINFER_SAMPLER=0 into the run's [reported.env]
    too: the report read that copy and showed no difference in the one setting #51187's thread
    argued about."""
    header = json.loads(H100.read_text().splitlines()[0])
    assert header["recipe"]["reported"]["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"  # the bug
    md = report_of(H100)
    top = md[: md.index("### How sure")]
    assert "> [!WARNING]" in top
    assert ("`env.VLLM_USE_FLASHINFER_SAMPLER` is `0` there, unset as reported" in top)
    assert "`VLLM_USE_FLASHINFER_SAMPLER=0`" in top.split("- Not as reported in", 1)[1]
    env = section(md, "Environment")
    by = {r[0]: (r[1], r[2]) for r in rows(env[env.index("Differences from the setup"):])}
    assert by["VLLM_USE_FLASHINFER_SAMPLER"] == ("unset", "0")
    data = json.loads(report_of(H100, "--format", "json"))
    assert data["differences"]["reported_changed"] == [
        ["env.VLLM_USE_FLASHINFER_SAMPLER", "unset", '"0"']]


def test_the_gpu_script_sets_the_sampler_for_the_lifetimes_and_leaves_the_reported_table(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu" / "release_range.sh"), "recipe"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DEV": str(tmp_path), "PY": sys.executable},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    written = tomllib.loads((tmp_path / "batch-invariance-range.toml").read_text())
    bundled = tomllib.loads(BUNDLED.read_text())
    assert written["runtime"]["env"] == {"VLLM_BATCH_INVARIANT": "1",
                                         "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert written["reported"] == bundled["reported"]


# -- the compiled files: against the wheel's own file list, or "not checked" ------------------


def test_an_empty_list_of_an_older_run_is_not_checked_and_a_found_one_is_named() -> None:
    assert compiled_files({"missing_extensions": ""})[0] is None  # flattened []: ambiguous
    assert compiled_files({"missing_extensions": ""})[1].startswith("not checked")
    assert compiled_files({"missing_extensions": "vllm/_moe_C.abi3.so"})[0] == [
        "vllm/_moe_C.abi3.so"]
    assert compiled_files({})[1] == "not recorded by this run"
    md = report_of(H100)
    env = {r[0]: r[1] for r in rows(section(md, "Environment"))}
    assert env["Compiled files of vllm missing from the pinned install"].startswith(
        "not checked: ")
    assert "none" not in env["Compiled files of vllm missing from the pinned install"]


def _install(site: Path, *, record: bool, present: bool) -> None:
    """A pinned package as pip lays it out: its files, and a dist-info whose RECORD is the
    wheel's file list (two compiled files, one of them left out where ``present`` is false)."""
    pkg = site / "fakevllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_C.abi3.so").write_bytes(b"\x7fELF")
    if present:
        (pkg / "_moe_C.abi3.so").write_bytes(b"\x7fELF")
    info = site / "fakevllm-0.26.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakevllm\nVersion: 0.26.0\n")
    if record:
        (info / "RECORD").write_text(
            "fakevllm/__init__.py,,\nfakevllm/_C.abi3.so,,\nfakevllm/_moe_C.abi3.so,,\n"
            "fakevllm-0.26.0.dist-info/METADATA,,\nfakevllm-0.26.0.dist-info/RECORD,,\n")


@pytest.mark.parametrize(("record", "present", "expected"), [
    (True, False, {"against": "the RECORD of fakevllm 0.26.0", "listed": 2,
                   "missing": ["fakevllm/_moe_C.abi3.so"]}),
    (True, True, {"against": "the RECORD of fakevllm 0.26.0", "listed": 2, "missing": []}),
    (False, False, {"not_checked": "the pinned install has no RECORD, the wheel's file list"}),
])
def test_the_pinned_interpreter_checks_the_install_against_its_wheels_file_list(
    tmp_path: Path, record: bool, present: bool, expected: dict[str, object]
) -> None:
    from bisect_tool.runtime.environment import _ENV_SCRIPT

    site = tmp_path / "site"
    _install(site, record=record, present=present)
    done = subprocess.run([sys.executable, "-c", _ENV_SCRIPT, "fakevllm"], capture_output=True,
                          text=True, timeout=60, cwd="/",
                          env={**os.environ, "PYTHONPATH": str(site)})
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["compiled_files"] == expected


# -- the attention backend vLLM chose --------------------------------------------------------


def test_the_attention_backend_is_read_from_the_servers_log() -> None:
    # the H100 run's log line (docs/bench/gpu-2026-12-07-h100/record.tgz, vllm-0.26.0-0.log)
    line = ("(EngineCore_DP0 pid=2119) INFO 12-07 10:05:48 [cuda.py:367] Using FLASH_ATTN "
            "attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN', "
            "'FLEX_ATTENTION'].")
    assert attention_backend(f"boot\n{line}\nready") == "FLASH_ATTN"
    assert attention_backend("INFO Using Flash Attention backend on V1 engine.") == (
        "Flash Attention")
    assert attention_backend("no such line") is None


def test_the_report_names_the_attention_backend_of_each_lifetime(tmp_path: Path) -> None:
    lines = [json.loads(x) for x in H100.read_text().splitlines()]
    for e in lines:
        if e.get("type") == "observation" and isinstance(e.get("detail"), dict) and (
                "mode" in e["detail"]):
            e["detail"]["attention_backend"] = "FLASH_ATTN"
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    env = {r[0]: r[1] for r in rows(section(report_of(path), "Environment"))}
    servers = sum(1 for e in lines if e.get("type") == "observation"
                  and "mode" in (e.get("detail") or {}))
    assert env["Attention backend (vLLM's choice, from the server log)"] == (
        f"FLASH_ATTN in all {servers} lifetimes")
    # the committed journal recorded none: said so, not guessed
    env = {r[0]: r[1] for r in rows(section(report_of(H100), "Environment"))}
    assert env["Attention backend (vLLM's choice, from the server log)"] == (
        "not recorded by this run")


# -- reproduce by hand: the run's own stack, the checkpoint's sha256, where bisect comes from ---


def _fence_after(md: str, words: str) -> str:
    start = md.index(words)
    body = md.index("```sh\n", start) + len("```sh\n")
    return md[body: md.index("```", body)]


def test_reproduce_rebuilds_the_runs_own_stack_not_a_fresh_install(tmp_path: Path) -> None:
    lines = [json.loads(x) for x in H100.read_text().splitlines()]
    digest = hashlib.sha256(b"weights").hexdigest()
    for e in lines:
        if e.get("type") == "environment":
            e["weights"]["files"] = {"model.safetensors": digest}
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    md = report_of(path)
    stack = _fence_after(md, "The pinned stack as this run had it").splitlines()
    assert stack[0] == "python3.12 -m venv stack && . stack/bin/activate"
    assert stack[1] == ("pip install vllm==0.26.0 torch==2.11.0+cu130 triton==3.6.0 "
                        "transformers==5.17.0 xgrammar==0.2.9 --extra-index-url "
                        "https://download.pytorch.org/whl/cu130")
    assert stack[2].startswith("pip uninstall -y flashinfer-python")  # the run had none
    assert any(x.startswith("# compiled files: not checked") for x in stack)
    assert "pip install vllm==0.26.0\n" not in md  # not the stack it claimed to be
    weights = _fence_after(md, "The weights:")
    assert f'echo "{digest}  qwen3-0.6b-random/model.safetensors" | sha256sum -c' in weights
    tool = md[md.index("#### Reproduce"):].splitlines()[2]
    assert tool.startswith("The tool: bisect 0.1.0+g16fe12e, the `bisect-tool` package at "
                           "commit `16fe12e`")
    assert "git checkout 16fe12e && pip install ." in tool


def test_a_pasted_report_names_no_session_and_no_folder_of_the_machine(tmp_path: Path) -> None:
    for journal in sorted((ROOT / "docs").rglob("*.jsonl")):
        md = report_of(journal)
        session = json.loads(journal.read_text().splitlines()[0]).get("session")
        assert "<sub>session" not in md and (not session or session not in md), journal
        assert not re.search(r"(?<![\w/])/(tmp|home|root|work)/", md), journal


# -- a run with no answer: its one cause once, with advice that fits -----------------------------


@pytest.mark.slow  # a whole bisect whose every commit is skipped
def test_a_run_whose_every_commit_was_skipped_names_the_cause_once(tmp_path: Path) -> None:
    repo = linear(tmp_path / "repo", 40)
    state = tmp_path / "state"
    code, _, err = run_cli("start", "--good", repo.main[0], "--bad", repo.main[-1], "--run",
                           "exit 125", "--repo", str(repo.path), "--state-dir", str(state), "-q")
    assert code == 9, err
    md = report_of(state / "journal.jsonl")
    first = md.split("\n\n")[1]
    assert first.startswith("**Nothing could run**: all ")
    assert "stopped on one cause, exit 125" in first and "pick another" not in first
    assert "the probe itself skips (exit 125) every commit" in first
    evidence = section(md, "Evidence")
    notes = [x for x in evidence.splitlines() if "could not run" in x]
    assert len(notes) == 1 and re.match(r"- \d+ candidates \(.* and \d+ more\) could not run: "
                                        r"exit 125$", notes[0]), notes
    # the worktree's temp folder in the probe's output is not the reader's business
    assert "/tmp/" not in md and "bisect-wt-" not in md


# -- the evidence: results first, every lifetime folded; the gate's ops whole ------------------


def test_results_come_before_the_candidates_that_could_not_run() -> None:
    evidence = section(report_of(H100), "Evidence")
    table = rows(evidence)
    verdicts = [r[1] for r in table]
    assert verdicts[:4] == ["DIVERGENT", "CLEAN", "CLEAN", "CLEAN"]
    assert set(verdicts[4:]) == {"UNTESTABLE"}
    assert evidence.index("<details>") < evidence.index("`#0`")  # every lifetime folded


def test_the_gate_refusals_name_whole_ops_and_say_what_the_gate_compared() -> None:
    md = report_of(H100)
    notes = [x for x in section(md, "Evidence").splitlines() if "gate refused" in x]
    assert len(notes) == 3  # one a distinct refusal: 0.22.x, 0.23.0, 0.24.0-0.25.1
    refusals = " ".join(json.loads(x).get("message", "") for x in H100.read_text().splitlines()
                        if '"stage": "gate"' in x)
    for note in notes:
        assert "..." not in note
        for op in re.findall(r"`(_C[^`]*)`", note):  # each a whole name of the gate's verdict
            name = op.removesuffix(" (missing)")
            assert re.search(re.escape(name) + r"[ ,)]", refusals), name
    assert notes[0].startswith("- 2 candidates (`v0.22.0`, `v0.22.1`) could not run")
    assert ("- The pinned stack's gate compared every op the pinned "
            "`_C_stable_libtorch.abi3.so` registers.") in md
    whole = md[md.index("#### The gate's verdicts, whole"):]
    assert "_C::machete_supported_schedules" in whole

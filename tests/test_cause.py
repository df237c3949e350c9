"""A failure in one line (issue 32, item 11): the first error of the log a dead server left, the
gate's verdict without both schemas, never the traceback itself. Read on the messages the GPU
runs journaled (docs/h200/) and on the shapes a reader meets most: a failing import."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_tool.cause import one_line, root_cause
from bisect_tool.verdict import controls_problem

ROOT = Path(__file__).resolve().parent.parent


def journaled(path: str, lifetime_id: str) -> str:
    for line in (ROOT / path).read_text().splitlines():
        entry = json.loads(line)
        if entry.get("lifetime_id") == lifetime_id:
            return str(entry["message"])
    raise AssertionError(f"{lifetime_id} not in {path}")


def test_a_dead_server_is_its_first_error_not_its_traceback() -> None:
    """vLLM 0.27.0's Python on torch 2.11 (docs/h200/releases/locate.jsonl): 3,770 characters
    of traceback become the line that says why."""
    message = journaled("docs/h200/releases/locate.jsonl", "locate-good-py-bad-c-0")
    assert len(message) > 3000 and message.count("\n") > 30
    line = one_line(message)
    assert line == (
        "lifetime locate-good-py-bad-c-0: server exited with code 1 before /health: "
        "ValidationError: 1 validation error for ModelConfig: Value error, Model architectures "
        "['Qwen3ForCausalLM'] failed to be inspected. Please check the logs for more details.")
    assert "\n" not in line and "File \"" not in line and "pid=" not in line


def test_the_first_error_wins_over_what_it_caused() -> None:
    tail = "\n".join([
        "(EngineCore_DP0 pid=88) INFO 12-05 loading vllm_flash_attn",
        "(EngineCore_DP0 pid=88) Traceback (most recent call last):",
        '(EngineCore_DP0 pid=88)   File "/site/vllm/vllm_flash_attn/__init__.py", line 3, in '
        "<module>",
        "(EngineCore_DP0 pid=88)     from ._vllm_fa3_C import *",
        "(EngineCore_DP0 pid=88) ImportError: /site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so: "
        "undefined symbol: _ZN3c1017RegisterOperatorsD1Ev",
        "(APIServer pid=87) RuntimeError: Engine core initialization failed. See root cause "
        "above. Failed core proc(s): {}",
    ])
    assert root_cause(tail) == (
        "ImportError: /site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so: undefined symbol: "
        "_ZN3c1017RegisterOperatorsD1Ev")
    assert one_line(f"lifetime x-0: server exited with code 1 before /health; log tail:\n{tail}"
                    ).endswith("before /health: ImportError: /site/vllm/vllm_flash_attn/"
                               "_vllm_fa3_C.abi3.so: undefined symbol: "
                               "_ZN3c1017RegisterOperatorsD1Ev")
    assert root_cause("booting\nKilled") == "Killed"
    assert root_cause("just a line") == "just a line"
    assert root_cause("") == "" and one_line("") == ""


def test_the_gates_verdict_names_the_op_not_both_schemas() -> None:
    message = journaled("docs/h200/journal-first-attempt-gate.jsonl", "11c0eb366988-0")
    assert one_line(message) == ("candidate 11c0eb366988: vllm/_C_stable_libtorch.abi3.so: op "
                                 "_C::dsv3_fused_a_gemm changed (and 1 more)")


def test_controls_that_could_not_run_stop_the_run_with_one_line() -> None:
    """The one-line error of a locate whose controls ran on a release the pinned stack cannot
    boot: the cause, not the tail."""
    tail = journaled("docs/h200/releases/locate.jsonl", "locate-good-py-good-c-0")
    problem = f"the controls could not run: boot failed: {tail}"
    entry = {"ok": False, "problem": problem, "positive": {"verdict": "untestable"},
             "negative": {"verdict": "untestable"}}
    said = controls_problem(entry)
    assert "\n" not in said and len(said) < 400
    assert said.startswith("controls failed, so a CLEAN would mean nothing: the controls could "
                           "not run: boot failed: lifetime locate-good-py-good-c-0: server exited")
    assert "failed to be inspected" in said

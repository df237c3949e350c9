"""Pure parts of the runtime: schema comparison, container spec, `bisect model` (the GPU pool
and the lifetimes sharing it: tests/test_runtime_gpus.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bisect_tool.cli import main
from bisect_tool.errors import UsageError
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.recipes.recipe import RuntimeSettings
from bisect_tool.runtime import compare_schemas
from bisect_tool.runtime.docker_backend import container_spec
from bisect_tool.runtime.schemas import parse_dump

# Schema dumps as vLLM's own extension registers them (vllm-facts.md): the current schema takes
# an optional weight; older builds took a required one.
PINNED = {
    "_C::rms_norm": (
        "_C::rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()"
    ),
    "_C::fused_add_rms_norm": (
        "_C::fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, "
        "float epsilon) -> ()"
    ),
}


def test_same_schemas_and_extra_ops_are_compatible() -> None:
    extra = {**PINNED, "_C::new_op": "_C::new_op(Tensor x) -> Tensor"}
    assert compare_schemas(PINNED, extra) == []
    spaced = {k: v.replace(", ", ",  ") for k, v in PINNED.items()}
    assert compare_schemas(PINNED, spaced) == []


def test_missing_and_changed_ops_are_named() -> None:
    older = {
        "_C::rms_norm": (
            "_C::rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()"
        )
    }
    assert compare_schemas(PINNED, older) == [
        "candidate lacks op _C::fused_add_rms_norm",
        "op _C::rms_norm changed: pinned '"
        + PINNED["_C::rms_norm"]
        + "' vs candidate '"
        + older["_C::rms_norm"]
        + "'",
    ]


def test_the_gates_verdict_names_every_rejected_op() -> None:
    """Issue 32, item 7: the message named the first op and "(and 3 more)"; a maintainer must
    see which ops the pinned Python could no longer call."""
    from bisect_tool.errors import IncompatibleExtension
    from bisect_tool.runtime.schemas import check_pair

    older = {"_C::rms_norm": "_C::rms_norm(Tensor! result, Tensor input, float epsilon) -> ()"}
    pinned = {**PINNED, "_C::silu_and_mul": "_C::silu_and_mul(Tensor! out, Tensor x) -> ()"}
    with pytest.raises(IncompatibleExtension) as err:
        check_pair("vllm/_C.abi3.so", pinned, older, "vllm-0.24.0")
    message = str(err.value)
    assert message.startswith("candidate vllm-0.24.0: vllm/_C.abi3.so: candidate lacks op "
                              "_C::fused_add_rms_norm")
    assert message.endswith(" (and 2 more: _C::rms_norm, _C::silu_and_mul (missing))")


@given(st.dictionaries(st.text("abc:_", min_size=1), st.text("abc(), ", min_size=1), max_size=6))
def test_every_pinned_op_is_either_matched_or_reported(candidate: dict[str, str]) -> None:
    problems = compare_schemas(PINNED, candidate)
    ok = [op for op in PINNED if op in candidate and candidate[op].split() == PINNED[op].split()]
    assert len(problems) + len(ok) == len(PINNED)


def test_dump_output_parsing() -> None:
    assert parse_dump('{"schemas": {"_C::a": "_C::a() -> ()"}, "error": null}', "x") == {
        "_C::a": "_C::a() -> ()"
    }
    assert parse_dump('{"missing": true}', "x") is None


def test_container_spec_asks_for_one_gpu_host_network_and_read_only_mounts(tmp_path: Path) -> None:
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"x")
    settings = RuntimeSettings(
        backend="docker",
        image="vllm/vllm-openai:v0.26.0",
        server_module="vllm.entrypoints.openai.api_server",
        server_args=("--enforce-eager",),
        env={"VLLM_BATCH_INVARIANT": "1"},
        model="/models/qwen",
        model_cache=str(tmp_path),
        shm_size="8g",
    )
    swap = SwapSet(commit="a" * 40, files={"vllm/_C_stable_libtorch.abi3.so": lib})
    spec = LifetimeSpec(session="s1", lifetime_id="aaaaaaaaaaaa-0", swap=swap, gpu="5")
    target = "/usr/local/lib/python3.12/dist-packages/vllm/_C_stable_libtorch.abi3.so"
    kw = container_spec(
        settings, spec, port=4321, targets={"vllm/_C_stable_libtorch.abi3.so": target}
    )
    assert kw["device_requests"] == [
        {"Driver": "", "Count": 0, "DeviceIDs": ["5"], "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert kw["network_mode"] == "host" and kw["shm_size"] == "8g"
    assert kw["entrypoint"] == ["python3"]
    assert kw["command"][-4:] == ["--host", "127.0.0.1", "--port", "4321"]
    assert kw["command"][:4] == [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--enforce-eager",
        "--model",
    ]
    assert kw["environment"]["VLLM_BATCH_INVARIANT"] == "1"
    swap_mount, cache_mount = kw["mounts"]
    assert (swap_mount["Target"], swap_mount["Source"], swap_mount["ReadOnly"]) == (
        target,
        str(lib.resolve()),
        True,
    )
    assert cache_mount["ReadOnly"] is True
    assert kw["labels"] == {
        "bisect.tool": "bisect",
        "bisect.session": "s1",
        "bisect.candidate": "a" * 40,
        "bisect.lifetime": "aaaaaaaaaaaa-0",
    }
    cpu = container_spec(
        settings,
        LifetimeSpec(session="s1", lifetime_id="x", swap=swap),
        port=1,
        targets={"vllm/_C_stable_libtorch.abi3.so": target},
    )
    assert "device_requests" not in cpu


def test_model_random_without_transformers_names_the_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch and transformers are installed here: the error path cannot show")
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "qwen3"}')
    with pytest.raises(SystemExit) as caught:
        main(["model", "random", "--config", str(config), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert caught.value.code != 0
    assert err.strip().splitlines() == [
        "bisect: random weights need transformers and torch: pip install transformers torch"
    ]
    assert not (tmp_path / "out").exists()


def test_model_random_with_missing_config_names_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["model", "random", "--config", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert caught.value.code == UsageError.exit_code
    assert "config not found" in capsys.readouterr().err


def test_gate_accepts_a_trailing_argument_with_a_default_but_not_a_required_one() -> None:
    # Measured on the H200 between vLLM 0.26.0 and 0.27.0's _C_stable_libtorch: the pinned
    # 0.26.0 Python still calls dsv3_fused_a_gemm with three arguments, so the new defaulted
    # one is compatible; a new required argument would break those calls.
    from bisect_tool.runtime.schemas import compare_schemas

    op = "_C::dsv3_fused_a_gemm"
    pinned = {op: f"{op}(Tensor($0! -> ) output, Tensor mat_a, Tensor mat_b) -> ()"}
    defaulted = {
        op: f"{op}(Tensor($0! -> ) output, Tensor mat_a, Tensor mat_b, bool enable_pdl=False) -> ()"
    }
    required = {
        op: f"{op}(Tensor($0! -> ) output, Tensor mat_a, Tensor mat_b, bool enable_pdl) -> ()"
    }
    changed_return = {op: f"{op}(Tensor($0! -> ) output, Tensor mat_a, Tensor mat_b) -> Tensor"}
    assert compare_schemas(pinned, defaulted) == []
    assert compare_schemas(pinned, required) == [
        f"op {op} changed: pinned '{pinned[op]}' vs candidate '{required[op]}'"
    ]
    assert len(compare_schemas(pinned, changed_return)) == 1


def test_the_gate_can_be_limited_to_the_ops_the_workload_calls() -> None:
    """[runtime] gate_ops: a crossing whose newer Python registers ops the older extension
    lacks (vLLM 0.27.0's Python with 0.26.0's _C) is judged on the ops that matter only."""
    from bisect_tool.errors import IncompatibleExtension
    from bisect_tool.interfaces import SwapSet
    from bisect_tool.runtime import schemas

    pinned = {"_C::rms_norm": "_C::rms_norm(Tensor! a) -> ()",
              "_C::relu_squared": "_C::relu_squared(Tensor! out, Tensor input) -> ()"}
    candidate = {"_C::rms_norm": "_C::rms_norm(Tensor! a) -> ()"}
    swap = SwapSet("c" * 40, {})
    with pytest.raises(IncompatibleExtension, match="lacks op _C::relu_squared"):
        schemas.check_extensions(swap, ["x.so"], lambda _r: pinned, lambda _r: candidate)
    schemas.check_extensions(swap, ["x.so"], lambda _r: pinned, lambda _r: candidate,
                             ["rms_norm"])
    changed = {"_C::rms_norm": "_C::rms_norm(Tensor a) -> ()"}
    with pytest.raises(IncompatibleExtension, match="op _C::rms_norm changed"):
        schemas.check_extensions(swap, ["x.so"], lambda _r: pinned, lambda _r: changed,
                                 ["_C::rms_norm"])


def test_a_dead_servers_one_line_cause_is_the_error_not_the_last_line() -> None:
    """The tail of vLLM 0.27.0 dying on the H200's torch 2.11 (docs/h200/releases/locate.jsonl):
    the last line is pydantic's link; the cause is two lines up."""
    from bisect_tool.runtime.common import likely_cause

    tail = "\n".join([
        '(APIServer pid=4217)   File "/tmp/dev/deps/pydantic/_internal/_dataclasses.py", line 121',
        "(APIServer pid=4217)     s.__pydantic_validator__.validate_python(ArgsKwargs(args))",
        "(APIServer pid=4217) pydantic_core._pydantic_core.ValidationError: 1 validation error "
        "for ModelConfig",
        "(APIServer pid=4217)   Value error, Model architectures ['Qwen3ForCausalLM'] failed to "
        "be inspected. Please check the logs for more details.",
        "(APIServer pid=4217)     For further information visit "
        "https://errors.pydantic.dev/2.14/v/value_error",
    ])
    assert likely_cause(tail) == (
        "Value error, Model architectures ['Qwen3ForCausalLM'] failed to be inspected. Please "
        "check the logs for more details.")
    assert likely_cause("booting\nKilled") == "Killed"
    assert likely_cause("just a line") == "just a line"  # nothing names an error: the last line
    assert likely_cause("") == ""
    assert len(likely_cause("RuntimeError: " + "x" * 500)) == 200

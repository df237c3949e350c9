"""Pure parts of the runtime: schema comparison, GPU pool, container spec, `bisect model`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bisect_tool.cli import main
from bisect_tool.errors import UsageError
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.recipe import RuntimeSettings
from bisect_tool.runtime import GpuPool, compare_schemas
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


class _Given:
    """An artifact provider whose every candidate's swap set is empty (fetched already)."""

    def get(self, commit: str, tags: object = ()) -> SwapSet:
        return SwapSet(commit, {})

    def prefetch(self, commits: object, tags: object) -> None:
        return None


def _server_evaluator(tmp_path: Path, backend: Any, probe: Any, pool: GpuPool,
                      boot_lock: Any = None) -> Any:
    """A server evaluator over ``backend`` whose lifetimes run ``probe``, on ``pool``'s GPUs."""
    from bisect_tool.evaluate.server import server_evaluator
    from bisect_tool.recipe import Recipe

    evaluator = server_evaluator(Recipe("t"), _Given(), backend, session="s", log_dir=tmp_path,
                                 tags={}, gpu_lease=pool.lease, boot_lock=boot_lock)
    evaluator.probe_factory = lambda sequential: probe
    return evaluator


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


def test_gpu_pool_runs_one_lifetime_per_gpu_at_a_time() -> None:
    pool = GpuPool(["0", "1"])
    assert pool.size == 2
    holders: list[str | None] = []
    peak = 0
    lock = threading.Lock()
    both_in = threading.Barrier(2)
    errors: list[BaseException] = []

    def work() -> None:
        nonlocal peak
        try:
            with pool.lease(timeout=30) as gpu:
                with lock:
                    assert gpu not in holders, f"GPU {gpu} leased twice"
                    holders.append(gpu)
                    peak = max(peak, len(holders))
                both_in.wait(timeout=30)  # the first two meet: two run at once
                with lock:
                    holders.remove(gpu)
        except threading.BrokenBarrierError:
            pass  # later pairs may not meet in step; the exclusivity check is what matters
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert peak == 2


def test_gpu_pool_without_gpus_gives_anonymous_slots() -> None:
    pool = GpuPool([], slots=3)
    assert pool.size == 3 and pool.gpus == ()
    with pool.lease() as a, pool.lease() as b, pool.lease() as c:
        assert (a, b, c) == (None, None, None)
        with pytest.raises(TimeoutError), pool.lease(timeout=0.01):
            pass
    with pool.lease(timeout=0.01) as again:  # given back on exit
        assert again is None


def test_lifetimes_sharing_a_gpu_boot_one_at_a_time_and_probe_together(tmp_path: Path) -> None:
    """[runtime] lifetimes_per_gpu = 2: the second lifetime boots while the first probes (the
    two probes meet at a barrier), but never while the first boots: two vLLM servers profiling
    one GPU at once each count the other's memory as their own."""
    import contextlib
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from bisect_tool.interfaces import ProbeResult, ServerHandle
    from bisect_tool.values import Verdict

    pool = GpuPool(["0"], per_gpu=2)
    lock = threading.Lock()
    booting, peak = [0], [0]
    both_booting = threading.Barrier(2, timeout=1)  # passes only if two boots overlap
    both_probing = threading.Barrier(2, timeout=30)

    class Backend:
        @contextlib.contextmanager
        def lifetime(self, spec: object) -> Any:
            with lock:
                booting[0] += 1
                peak[0] = max(peak[0], booting[0])
            with contextlib.suppress(threading.BrokenBarrierError):
                both_booting.wait()
            with lock:
                booting[0] -= 1
            yield ServerHandle("http://127.0.0.1:1", "x", tmp_path / "log")

        def check_compatible(self, swap: SwapSet) -> None:
            return None

    class Probe:
        def run(self, server: ServerHandle, is_alive: object = None) -> ProbeResult:
            both_probing.wait()  # both lifetimes are up at once
            return ProbeResult(Verdict.CLEAN, {}, "clean")

    evaluator = _server_evaluator(tmp_path, Backend(), Probe(), pool, pool.booting)
    with ThreadPoolExecutor(2) as threads:
        seen = list(threads.map(lambda lid: evaluator.evaluate("c" * 40, lid), ["a", "b"]))
    assert [o.verdict for o in seen] == [Verdict.CLEAN, Verdict.CLEAN]
    assert peak[0] == 1


def test_the_controls_own_slot_is_free_while_every_lifetime_slot_is_held() -> None:
    pool = GpuPool(["0"], per_gpu=2, controls_slot=True)
    assert pool.size == 2  # the lifetimes' slots: the controls' is not one of them
    with pool.lease() as a, pool.lease() as b:
        assert (a, b) == ("0", "0")
        with pool.controls_lease(timeout=0.01) as controls:
            assert controls == "0"
            with pytest.raises(TimeoutError), pool.controls_lease(timeout=0.01):
                pass  # one server for the controls, not one per ask
    shared = GpuPool(["0"], per_gpu=2)
    with shared.lease(), shared.lease(), pytest.raises(TimeoutError), \
            shared.controls_lease(timeout=0.01):
        pass  # without it the controls wait for a lifetime's slot, as before


def test_with_controls_own_slot_the_controls_run_beside_two_lifetimes_on_one_gpu(
    tmp_path: Path,
) -> None:
    """[runtime] controls_own_slot = true: the controls' server probes while both lifetimes'
    servers do, the three on the one GPU (on the H100 the controls held one of the two
    lifetimes' slots for 259 s, and the confirm step ran one lifetime at a time)."""
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    from bisect_tool.evaluate.server import controls_runner
    from bisect_tool.interfaces import ProbeResult, ServerHandle
    from bisect_tool.recipe import ProbeSettings, from_dict
    from bisect_tool.values import Verdict
    from bisect_tool.wiring import gpu_pool

    recipe = from_dict({"name": "r", "runtime": {"gpus": ["0"], "lifetimes_per_gpu": 2,
                                                 "controls_own_slot": True}})
    pool = gpu_pool(recipe.runtime)
    three_probing = threading.Barrier(3, timeout=10)  # passes only if all three are up at once
    on: list[str | None] = []

    class Backend:
        @contextlib.contextmanager
        def lifetime(self, spec: LifetimeSpec) -> Any:
            on.append(spec.gpu)
            yield ServerHandle("http://127.0.0.1:1", "x", tmp_path / "log")

        def check_compatible(self, swap: SwapSet) -> None:
            return None

    class Probe:
        def __init__(self, sequential: bool) -> None:
            self.sequential = sequential

        def run(self, server: ServerHandle, is_alive: object = None) -> ProbeResult:
            if self.sequential:  # the negative control, once the three have met
                return ProbeResult(Verdict.CLEAN, {}, "clean")
            three_probing.wait()
            return ProbeResult(Verdict.DIVERGENT, {}, "divergent")

    evaluator = _server_evaluator(tmp_path, Backend(), None, pool, pool.booting)
    evaluator.probe_factory = Probe
    runner = controls_runner(ProbeSettings(), evaluator, "c" * 40, {},
                             gpu_lease=pool.controls_lease)
    with ThreadPoolExecutor(3) as threads:
        lifetimes = [threads.submit(evaluator.evaluate, "d" * 40, lid) for lid in ("a", "b")]
        controls = threads.submit(runner.run).result(timeout=30)
        seen = [f.result(timeout=30) for f in lifetimes]
    assert [o.verdict for o in seen] == [Verdict.DIVERGENT, Verdict.DIVERGENT]
    assert controls["ok"] and controls["attempts"] == 1
    assert on == ["0", "0", "0"]


def test_a_lifetime_that_waited_for_a_gpu_says_so_and_its_boot_leaves_the_wait_out(
    tmp_path: Path,
) -> None:
    """One GPU slot, two lifetimes: the second waits while the first holds it. On the H100 a
    lifetime said "clean in 148.0s" of which 91 s were the controls' server holding the slot."""
    import contextlib
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from bisect_tool.events import LifetimeEnded
    from bisect_tool.interfaces import ProbeResult, ServerHandle
    from bisect_tool.progress import describe
    from bisect_tool.values import Verdict

    pool = GpuPool(["0"], per_gpu=1)
    first_up = threading.Event()

    class Backend:
        @contextlib.contextmanager
        def lifetime(self, spec: Any) -> Any:
            yield ServerHandle("http://127.0.0.1:1", "x", tmp_path / "log")

        def check_compatible(self, swap: SwapSet) -> None:
            return None

    class Probe:
        def run(self, server: ServerHandle, is_alive: object = None) -> ProbeResult:
            if not first_up.is_set():
                first_up.set()
                time.sleep(1.5)  # the first lifetime holds the only GPU slot a while
            return ProbeResult(Verdict.CLEAN, {}, "clean")

    evaluator = _server_evaluator(tmp_path, Backend(), Probe(), pool, None)
    with ThreadPoolExecutor(2) as threads:
        first = threads.submit(evaluator.evaluate, "c" * 40, "a")
        assert first_up.wait(10)
        second = threads.submit(evaluator.evaluate, "c" * 40, "b").result()
        first.result()
    timing = second.detail["timing"]
    assert timing["gpu_wait_s"] >= 1.0 and timing["boot_s"] < 0.5
    line = describe(LifetimeEnded(second.commit, "b", "clean", second.message,
                                  second.duration_s, dict(second.detail)))
    assert line is not None and "waiting for a GPU" in line
    assert float(line.split(" in ")[1].split("s,")[0]) < 0.5  # the lifetime itself


def test_a_lifetime_records_the_attention_backend_its_server_log_names(tmp_path: Path) -> None:
    """Issue 41: the report names the attention backend vLLM chose; each lifetime reads it from
    its own server's log (the line as vLLM 0.26 logs it, vllm/platforms/cuda.py)."""
    import contextlib

    from bisect_tool.interfaces import ProbeResult, ServerHandle
    from bisect_tool.values import Verdict

    class Backend:
        @contextlib.contextmanager
        def lifetime(self, spec: Any) -> Any:
            log = tmp_path / f"{spec.lifetime_id}.log"
            log.write_text("(EngineCore_DP0 pid=9) INFO [cuda.py:367] Using TRITON_ATTN attention "
                           "backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN'].\n"
                           if spec.lifetime_id == "a" else "a server that names none\n")
            yield ServerHandle("http://127.0.0.1:1", spec.lifetime_id, log)

        def check_compatible(self, swap: SwapSet) -> None:
            return None

    class Probe:
        def run(self, server: ServerHandle, is_alive: object = None) -> ProbeResult:
            return ProbeResult(Verdict.CLEAN, {}, "clean")

    evaluator = _server_evaluator(tmp_path, Backend(), Probe(), GpuPool(["0"]), None)
    assert evaluator.evaluate("c" * 40, "a").detail["attention_backend"] == "TRITON_ATTN"
    assert "attention_backend" not in evaluator.evaluate("c" * 40, "b").detail


def test_gpu_pool_rejects_bad_lists() -> None:
    with pytest.raises(UsageError, match="listed twice"):
        GpuPool(["0", "0"])
    with pytest.raises(UsageError, match="empty GPU id"):
        GpuPool(["0", ""])


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


def test_a_teardown_waits_while_another_lifetime_on_its_gpu_boots(tmp_path: Path) -> None:
    """A torn-down server frees memory; a neighbour profiling at that moment would see free
    memory grow and stop ("Error in memory profiling", vLLM v0.26 gpu_worker). So lifetime a,
    done while b still boots, is torn down only once b's boot has ended."""
    import contextlib
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from bisect_tool.interfaces import ProbeResult, ServerHandle
    from bisect_tool.values import Verdict

    pool = GpuPool(["0"], per_gpu=2)
    order: list[str] = []
    a_up = threading.Event()
    b_booting = threading.Event()  # b holds the GPU's turn from here until its boot ends
    a_wants_down = threading.Event()

    class Backend:
        @contextlib.contextmanager
        def lifetime(self, spec: Any) -> Any:
            name = spec.lifetime_id
            if name == "b":
                a_up.wait(10)
                order.append("b boots")
                b_booting.set()
                # b's boot goes on after a asked to be torn down
                assert a_wants_down.wait(10)
                order.append("b booted")
            else:
                order.append("a booted")
                a_up.set()
            try:
                yield ServerHandle("http://127.0.0.1:1", name, tmp_path / "log")
            finally:
                order.append(f"{name} torn down")

        def check_compatible(self, swap: SwapSet) -> None:
            return None

    class Probe:
        def run(self, server: ServerHandle, is_alive: object = None) -> ProbeResult:
            if server.lifetime_id == "a":
                # a is done once b is booting: its teardown must wait for b's boot to end,
                # which goes on a moment after a asked to be torn down
                assert b_booting.wait(10)
                threading.Timer(0.2, a_wants_down.set).start()
            return ProbeResult(Verdict.CLEAN, {}, "clean")

    evaluator = _server_evaluator(tmp_path, Backend(), Probe(), pool, pool.booting)
    with ThreadPoolExecutor(2) as threads:
        first = threads.submit(evaluator.evaluate, "c" * 40, "a")
        assert a_up.wait(10)
        second = threads.submit(evaluator.evaluate, "c" * 40, "b")
        seen = [first.result(timeout=30), second.result(timeout=30)]
    assert [o.verdict for o in seen] == [Verdict.CLEAN, Verdict.CLEAN]
    assert order.index("a torn down") > order.index("b booted")


def test_servers_told_their_kv_cache_size_boot_side_by_side() -> None:
    """vLLM's --kv-cache-memory-bytes skips the free-memory profile, so boots need no turn."""
    from bisect_tool.runtime.gpus import profiles_free_memory

    assert profiles_free_memory(["--enforce-eager", "--gpu-memory-utilization", "0.3"])
    assert not profiles_free_memory(["--kv-cache-memory-bytes", "4294967296"])
    assert not profiles_free_memory(["--kv-cache-memory-bytes=4G"])
    assert profiles_free_memory(["--kv-cache-memory-bytes-not", "1"])

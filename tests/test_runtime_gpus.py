"""The runtime's GPU pool and the lifetimes that share it: one lifetime per GPU at a time,
boots one at a time beside running probes, the controls' own slot, waits, teardowns and KV cache
sizes (tests/test_runtime_units.py has the rest of the runtime's pure parts)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest

from bisect_tool.errors import UsageError
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.runtime import GpuPool


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
    from bisect_tool.recipes.recipe import Recipe

    evaluator = server_evaluator(Recipe("t"), _Given(), backend, session="s", log_dir=tmp_path,
                                 tags={}, gpu_lease=pool.lease, boot_lock=boot_lock)
    evaluator.probe_factory = lambda sequential: probe
    return evaluator


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


def test_a_card_holds_at_most_the_knee_the_controls_counted() -> None:
    """Issue 39's knee on the H100: 8 servers kept the probe's co-residency, 10 did not. Six
    lifetimes a card and the controls' three servers of their own would make nine: while the
    controls run, the sixth lifetime waits; once they are done it starts."""
    pool = GpuPool(["0"], per_gpu=6, controls_slot=True, controls_servers=3, most_servers=8)
    with contextlib.ExitStack() as held:
        controls = [held.enter_context(pool.controls_lease(timeout=1)) for _ in range(3)]
        assert controls == ["0", "0", "0"]
        with contextlib.ExitStack() as lifetimes:
            for _ in range(5):
                lifetimes.enter_context(pool.lease(timeout=1))
            with pytest.raises(TimeoutError), pool.lease(timeout=0.05):
                pass  # the ninth server would be past the knee
            held.close()  # the controls end
            with pool.lease(timeout=1) as sixth:
                assert sixth == "0"
    # the H100's "again" run: the six lifetimes leased before the controls' three servers, and
    # nine shared the card. Reserved when the controls are handed out, they keep their room
    pool = GpuPool(["0"], per_gpu=6, controls_slot=True, controls_servers=3, most_servers=8)
    pool.reserve_controls()
    with contextlib.ExitStack() as held:
        for _ in range(5):
            held.enter_context(pool.lease(timeout=1))
        with pytest.raises(TimeoutError), pool.lease(timeout=0.05):
            pass  # the sixth lifetime waits: three servers of the eight are the controls'
        for _ in range(3):
            held.enter_context(pool.controls_lease(timeout=1))
        assert pool.sharing("0") == 8
    pool.release_controls()
    with contextlib.ExitStack() as held:
        for _ in range(6):
            held.enter_context(pool.lease(timeout=1))  # the controls ended: six lifetimes
    unbounded = GpuPool(["0"], per_gpu=6, controls_slot=True, controls_servers=3)
    with contextlib.ExitStack() as held:
        for _ in range(3):
            held.enter_context(unbounded.controls_lease(timeout=1))
        for _ in range(6):
            held.enter_context(unbounded.lease(timeout=1))  # a number given: no ceiling


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
    from bisect_tool.recipes.recipe import ProbeSettings, from_dict
    from bisect_tool.run.wiring import gpu_pool
    from bisect_tool.values import Verdict

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
    from bisect_tool.run.progress import describe
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

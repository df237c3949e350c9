"""The Ray backend: swap sets shipped and checked, and a real two-node Ray cluster that loses a
node mid-bisect and still finds the planted commit.

The cluster test needs ``ray`` (``pip install 'bisect-tool[ray]'``) and root for a network
namespace: Ray takes the machine's interface address even when told 127.0.0.1, so the Ray
processes and the driver run in ``unshare --net --pid --fork --mount-proc`` with only loopback
up. The PID namespace also means ``ray stop --force`` and the node kill see only this cluster's
processes, and that everything left dies with the namespace.

This file is also the driver: ``python tests/test_ray.py drive ...`` runs inside the namespace.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bisect_tool.errors import InfrastructureError
from bisect_tool.evaluate.ray import INSTALL_HINT
from bisect_tool.evaluate.ray_ship import pack_swap, unpack_swap
from bisect_tool.interfaces import SwapSet

ROOT = Path(__file__).resolve().parent.parent
HEAD_PORT = 6391
WORKER_NM_PORT = 46391  # the worker node's raylet is found by this port on its command line

try:
    import ray  # noqa: F401

    RAY_MISSING = ""
except ImportError:
    RAY_MISSING = f"ray is not installed ({INSTALL_HINT})"


# ---- shipping a swap set (no cluster needed) ---------------------------------------------------


def _swap(tmp_path: Path, data: bytes = b"\x7fELF candidate kernels") -> SwapSet:
    path = tmp_path / "cache" / "abc" / "_kernels.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    return SwapSet(
        "a" * 40,
        {"demollm/_kernels.so": path},
        "source-build",
        "x",
        {"demollm/_kernels.so": digest},
    )


def test_swap_set_arrives_byte_identical_in_the_node_cache(tmp_path: Path) -> None:
    swap = _swap(tmp_path)
    shipped = pack_swap(swap)
    arrived = unpack_swap(shipped, tmp_path / "node")
    placed = arrived.files["demollm/_kernels.so"]
    assert placed.read_bytes() == b"\x7fELF candidate kernels"
    assert tmp_path / "node" in placed.parents  # a node-local copy, not the driver's path
    assert arrived.sha256 == swap.sha256
    again = unpack_swap(shipped, tmp_path / "node")  # content-addressed: reused
    assert again.files == arrived.files


def test_corrupted_bytes_are_an_infrastructure_error_not_a_verdict(tmp_path: Path) -> None:
    shipped = pack_swap(_swap(tmp_path))
    f = shipped.files[0]
    bad = type(shipped)(shipped.commit, (type(f)(f.rel, f.sha256, data=b"flipped"),))
    with pytest.raises(InfrastructureError, match="arrived corrupted"):
        unpack_swap(bad, tmp_path / "node")
    assert not (tmp_path / "node").exists() or not any((tmp_path / "node").rglob("*.so"))


def test_a_changed_cache_file_is_refused_on_the_driver(tmp_path: Path) -> None:
    swap = _swap(tmp_path)
    swap.files["demollm/_kernels.so"].write_bytes(b"changed after it was verified")
    with pytest.raises(InfrastructureError, match="changed in the artifact cache"):
        pack_swap(swap)


def test_shared_cache_sends_paths_and_the_node_checks_them(tmp_path: Path) -> None:
    swap = _swap(tmp_path)
    shipped = pack_swap(swap, shared_cache=str(tmp_path / "cache"))
    assert shipped.files[0].data is None  # only the path and hash travel
    arrived = unpack_swap(shipped, tmp_path / "node")
    assert arrived.files["demollm/_kernels.so"] == swap.files["demollm/_kernels.so"].resolve()
    swap.files["demollm/_kernels.so"].write_bytes(b"stale mount")
    with pytest.raises(InfrastructureError, match="stale or not shared"):
        unpack_swap(shipped, tmp_path / "node")


class _FakeRay:
    """The slice of the ``ray`` module RayEvaluator uses, on a cluster of ``gpus`` GPUs: tasks
    return a clean lifetime at once; ``put`` takes a while (a large object), and is counted."""

    class exceptions:  # noqa: N801 (ray.exceptions)
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            pass

        class TaskCancelledError(RayError):
            pass

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.options: list[dict[str, Any]] = []
        self.puts = 0
        self._lock = threading.Lock()

    def remote(self, fn: Any) -> Any:
        ray = self

        class Remote:
            def options(self, **kwargs: Any) -> Any:
                ray.options.append({"fn": fn.__name__, **kwargs})
                return self

            def remote(self, *args: Any) -> str:
                return "result"

        return Remote()

    def put(self, value: Any) -> str:
        time.sleep(0.05)
        with self._lock:
            self.puts += 1
        return f"object-{self.puts}"

    def wait(self, refs: list[Any], timeout: float = 0) -> tuple[list[Any], list[Any]]:
        return refs, []

    def get(self, ref: Any) -> dict[str, Any]:
        return {"verdict": "clean", "detail": {}, "message": "", "lifetime_s": 0.1,
                "where": {"node_id": "n", "gpus": ["0"], "pid": 1}}

    def cluster_resources(self) -> dict[str, float]:
        return {"GPU": float(self.gpus)}

    def available_resources(self) -> dict[str, float]:
        return {"GPU": float(self.gpus)}


def test_ray_lifetimes_share_gpus_or_span_several_and_each_commit_ships_once(
    tmp_path: Path,
) -> None:
    """Issue 44: on Ray, ``lifetimes_per_gpu = 2`` makes each lifetime's task ask half a GPU
    (Ray's fractional GPUs), so a cluster of 2 GPUs runs 4 at once; ``gpus_per_lifetime = 2``
    asks two whole GPUs of one node. Six lifetimes of one commit started from four threads at
    once put its swap set in the object store once, not once a lifetime."""
    from concurrent.futures import ThreadPoolExecutor

    from bisect_tool.evaluate.ray import RayEvaluator
    from bisect_tool.recipes.recipe import ProbeSettings, RuntimeSettings

    swap = _swap(tmp_path)
    fake = _FakeRay(gpus=2)
    shared = RayEvaluator(_FixedSwap(swap), RuntimeSettings(lifetimes_per_gpu=2),
                          ProbeSettings(), session="s", tags={}, ray_module=fake)  # type: ignore[arg-type]
    assert shared.parallel == 4
    assert {o["fn"]: o["num_gpus"] for o in fake.options} == {
        "run_lifetime_task": 0.5, "run_controls_task": 0.5}
    with ThreadPoolExecutor(4) as threads:
        seen = list(threads.map(lambda i: shared.evaluate(swap.commit, f"l-{i}"), range(6)))
    assert {str(o.verdict) for o in seen} == {"clean"}
    assert fake.puts == 1 and shared.shipped == 1
    wide = _FakeRay(gpus=2)
    tp = RayEvaluator(_FixedSwap(swap), RuntimeSettings(gpus=("0", "1"), gpus_per_lifetime=2),
                      ProbeSettings(), session="s", tags={}, ray_module=wide)  # type: ignore[arg-type]
    assert tp.parallel == 1 and wide.options[0]["num_gpus"] == 2.0


def test_backend_ray_without_ray_names_the_install_command(tmp_path: Path) -> None:
    """Run the real CLI with ``ray`` made unimportable: one line, the install command."""
    from bisect_tool.demo.history import generate

    history = generate(tmp_path / "repo", seed=0, commits=60)
    recipe = _demo_recipe(tmp_path)
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["ray"] = None  # import ray -> ImportError, as when the extra is missing
        from bisect_tool.cli import main
        main(["start", "--good", "{history.good_tag}", "--bad", "{history.bad_tag}",
              "--recipe", "{recipe}", "--repo", "{tmp_path / "repo"}",
              "--state-dir", "{tmp_path / "state"}", "--backend", "ray", "--no-controls"])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert last.startswith("bisect:") and INSTALL_HINT in last


# ---- a real two-node cluster -------------------------------------------------------------------


def _demo_recipe(workdir: Path) -> Path:
    """The bundled demo recipe with the pinned stack and cache filled in, as `bisect demo` does."""
    import re

    from bisect_tool.demo import pinned
    from bisect_tool.recipes import recipe as recipe_mod

    pinned.ensure_pinned_build()
    text = recipe_mod.find("demo").read_text()
    text = re.sub(
        r'(?m)^pinned_package_dir = ""', f'pinned_package_dir = "{pinned.STACK_DIR}"', text
    )
    text = re.sub(
        r"(?m)^\[artifacts\]", f'[artifacts]\ncache_dir = "{workdir / "cache"}"', text, count=1
    )
    path = workdir / "demo-recipe.toml"
    path.write_text(text)
    return path


def _netns_problem() -> str:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip missing: cannot make a loopback-only network namespace"
    proc = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "ip", "link", "set", "lo", "up"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    if proc.returncode != 0:
        return f"no network namespace here ({proc.stderr.strip()[:120]}); needs root/CAP_SYS_ADMIN"
    return ""


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_bisect_on_two_ray_nodes_survives_losing_one(tmp_path: Path) -> None:
    result = run_on_cluster(tmp_path, worker=True)
    print(json.dumps({k: v for k, v in result.items() if k != "attempts"}, indent=1))
    assert result["error"] == "", result["error"]
    assert result["state"] == "done"
    assert result["flip_commit"] == result["planted_commit"]
    assert result["killed_lifetime"], "the worker node was never killed mid-lifetime"
    # Both nodes ran lifetimes, and the one lost with its node was rerun, recorded exactly once.
    assert len(result["nodes"]) == 2, result["nodes"]
    assert result["lifetime_ids_unique"]
    assert result["killed_lifetime_count"] == 1
    assert result["killed_lifetime_node"] != result["worker_node_id"]
    # Infrastructure failures are retried, then raised: never a verdict.
    assert "failed on the Ray cluster 3 times" in result["infra_error"], result["infra_error"]
    # Ctrl-C: the running lifetime's task is cancelled and its server is gone.
    assert result["cancel_saw_server"] and result["cancelled_tasks"] == 1
    assert "cancelled" in result["cancel_outcome"].get("abort", ""), result["cancel_outcome"]
    assert result["leftover_servers"] == 0
    # The controls ran as a Ray task and came back as a journal entry (ok or not: intermittent).
    assert result["controls"]["type"] == "controls"
    assert result["controls"]["ok"] in (True, False)


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_ray_driver_killed_mid_run_and_resumed_loses_and_doubles_nothing(tmp_path: Path) -> None:
    """The crash test on the Ray backend: kill -9 the driver while lifetimes run as Ray tasks,
    `bisect resume`: the journal before the kill is a prefix of the final one, every lifetime id
    is journaled once (the ones in flight at the kill included), and the answer is right."""
    result = run_on_cluster(tmp_path, worker=False, extra="crash")
    print(json.dumps(result, indent=1))
    assert result["error"] == "", result["error"]
    assert result["killed_rc"] == -signal.SIGKILL
    assert result["in_flight"], "no lifetime was running as a Ray task at the kill"
    assert result["resume_rc"] == 0, result["resume_err"]
    assert result["prefix_kept"], "a lifetime journaled before the kill was lost"
    assert result["lifetime_ids_unique"], "a lifetime was counted twice"
    assert all(n == 1 for n in result["in_flight_counts"].values()), result["in_flight_counts"]
    assert result["observations"] > result["observations_at_kill"] >= 2
    assert result["state"] == "done" and result["flip_commit"] == result["planted_commit"]
    assert result["leftover_servers"] == 0


def run_on_cluster(tmp_path: Path, *, worker: bool, extra: str = "") -> dict[str, Any]:
    """The driver's result of a run on a local Ray cluster (2 logical GPUs; a worker node too
    with ``worker``) inside a namespace with only loopback; skips where Ray or the namespace is
    missing, saying why."""
    if RAY_MISSING:
        print(f"skipped: {RAY_MISSING}")
        pytest.skip(RAY_MISSING)
    problem = _netns_problem()
    if problem:
        print(f"skipped: {problem}")
        pytest.skip(problem)
    # Short: Ray's unix socket paths live under the temp dir (108-byte limit).
    ray_tmp = Path(tempfile.mkdtemp(prefix="bray", dir="/tmp"))
    try:
        out = tmp_path / "result.json"
        script = cluster_script(ray_tmp, tmp_path / "work", out, num_gpus=2, worker=worker,
                                extra=extra)
        proc = subprocess.run(
            ["unshare", "--net", "--pid", "--fork", "--mount-proc", "bash", "-c", script],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )
        assert out.exists(), (
            f"driver wrote no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
        result: dict[str, Any] = json.loads(out.read_text())
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return result


def cluster_script(
    ray_tmp: Path, workdir: Path, out: Path, *, num_gpus: int, worker: bool, extra: str = ""
) -> str:
    """Bash for inside the namespace: a head (+ a worker node), the driver, then stop."""
    venv_bin = Path(sys.executable).parent
    common = "--node-ip-address 127.0.0.1 --disable-usage-stats --num-cpus 4"
    worker_cmd = (
        f"ray start --address 127.0.0.1:{HEAD_PORT} {common} --num-gpus {num_gpus} "
        f"--node-manager-port {WORKER_NM_PORT} >/dev/null\n"
        if worker
        else ""
    )
    return (
        textwrap.dedent(
            f"""\
        ip link set lo up
        export PATH={venv_bin}:$PATH RAY_USAGE_STATS_ENABLED=0
        # Notice a lost node in ~3 s instead of ~15 s (GCS health checks).
        export RAY_health_check_period_ms=1000 RAY_health_check_failure_threshold=3
        export RAY_health_check_initial_delay_ms=1000
        ray start --head --port {HEAD_PORT} {common} --num-gpus {num_gpus} \\
            --include-dashboard=false --temp-dir {ray_tmp} >/dev/null || exit 3
        """
        )
        + worker_cmd
        + textwrap.dedent(
            f"""\
        {sys.executable} {Path(__file__).resolve()} {extra or "drive"} --workdir {workdir} \\
            --address 127.0.0.1:{HEAD_PORT} --out {out}
        rc=$?
        ray stop --force >/dev/null 2>&1
        exit $rc
        """
        )
    )


# ---- the driver, run inside the namespace ------------------------------------------------------


def _worker_raylet() -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            cmd
            and cmd[0].endswith(b"raylet")
            and (f"--node_manager_port={WORKER_NM_PORT}".encode() in cmd)
        ):
            return int(entry.name)
    return None


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _env_of(pid: int, name: str) -> str:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return ""
    prefix = f"{name}=".encode()
    return next((e[len(prefix) :].decode() for e in env if e.startswith(prefix)), "")


def _kill_worker_node_mid_lifetime(
    journal: Path, state: dict[str, Any], stop: threading.Event, worker_node: str
) -> None:
    """Once the worker node has a lifetime journaled and serves another, SIGKILL the node: its
    raylet and every process under it, the lifetime's server included (a machine lost).

    Waiting for a journaled lifetime of the worker (not for any two lifetimes) is what makes
    "both nodes ran lifetimes" hold however the machine's speed orders the first ones."""
    while not stop.wait(0.2):
        raylet = _worker_raylet()
        if raylet is None or not journal.exists():
            continue
        if worker_node not in journal.read_text():
            continue
        below = _descendants(raylet)
        serving = [p for p in below if _env_of(p, "BISECT_LIFETIME")]
        if not serving:
            continue
        state["killed_lifetime"] = _env_of(serving[0], "BISECT_LIFETIME")
        for pid in [raylet, *below]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return


class _FixedSwap:
    """Provider with one swap set (the driver side needs nothing more for these checks)."""

    def __init__(self, swap: SwapSet) -> None:
        self.swap = swap

    def get(self, commit: str, tags: Any = ()) -> SwapSet:
        return self.swap

    def prefetch(self, commits: Any, tags: Any) -> None:
        return None


def _faults(workdir: Path, recipe_path: Path, bad_tag: str) -> dict[str, Any]:
    """After the bisect, on the surviving node: an infrastructure failure on every attempt, and
    a cancelled lifetime (what Ctrl-C does)."""
    import dataclasses

    from bisect_tool.artifacts import make_provider
    from bisect_tool.errors import AbortError
    from bisect_tool.evaluate.ray import ray_evaluator
    from bisect_tool.recipes import recipe as recipe_mod

    found: dict[str, Any] = {}
    recipe = recipe_mod.load(str(recipe_path))
    # A shared cache the node cannot read: the task fails with InfrastructureError each time.
    shared = workdir / "not-mounted"
    broken = dataclasses.replace(
        recipe, runtime=dataclasses.replace(recipe.runtime, ray_shared_cache=str(shared))
    )
    swap = SwapSet(
        "b" * 40,
        {"demollm/_kernels.so": shared / "_kernels.so"},
        sha256={"demollm/_kernels.so": "0" * 64},
    )
    with ray_evaluator(_FixedSwap(swap), broken, session="faults", tags={}) as ev:
        try:
            obs = ev.evaluate("b" * 40, "bbbbbbbbbbbb-0")
            found["infra_error"] = f"no error, got {obs.verdict}"
        except InfrastructureError as exc:
            found["infra_error"] = str(exc)
    sha = subprocess.run(
        ["git", "-C", str(workdir / "repo"), "rev-parse", f"{bad_tag}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with (
        make_provider(recipe.artifacts, workdir / "repo", log_dir=workdir / "logs") as provider,
        ray_evaluator(provider, recipe, session="cancelme", tags={}) as ev,
    ):
        controls = ev.controls_for(sha).run()
        found["controls"] = {k: controls.get(k) for k in ("type", "commit", "ok")}
        outcome: dict[str, str] = {}

        def run() -> None:
            try:
                outcome["obs"] = str(ev.evaluate(sha, f"{sha[:12]}-cancel").verdict)
            except AbortError as exc:
                outcome["abort"] = str(exc)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _servers_of("cancelme"):
            time.sleep(0.1)  # wait until the lifetime's server runs on the node
        found["cancel_saw_server"] = bool(_servers_of("cancelme"))
        found["cancelled_tasks"] = ev.cancel()
        thread.join(30)
        found["cancel_outcome"] = outcome
    found["leftover_servers"] = len(_servers_of("cancelme"))
    return found


def _servers_of(session: str) -> list[int]:
    return [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit() and _env_of(int(e.name), "BISECT_SESSION") == session
    ]


def drive(workdir: Path, address: str, out: Path) -> None:
    import ray as ray_mod

    from bisect_tool import cli as cli_mod
    from bisect_tool import journal as journal_mod
    from bisect_tool.demo.history import generate

    result: dict[str, Any] = {"error": "", "killed_lifetime": ""}
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        history = generate(workdir / "repo", seed=0, commits=80)
        recipe = _demo_recipe(workdir)
        state_dir = workdir / "state"
        journal = state_dir / journal_mod.JOURNAL_NAME
        ray_mod.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        worker_node = next(
            n["NodeID"]
            for n in ray_mod.nodes()
            if n["Alive"] and n.get("NodeManagerPort") == WORKER_NM_PORT
        )
        ray_mod.shutdown()
        stop = threading.Event()
        killer = threading.Thread(
            target=_kill_worker_node_mid_lifetime,
            args=(journal, result, stop, worker_node),
            daemon=True,
        )
        killer.start()
        try:
            cli_mod.cli.main(
                args=[
                    "start",
                    "--good",
                    history.good_tag,
                    "--bad",
                    history.bad_tag,
                    "--recipe",
                    str(recipe),
                    "--repo",
                    str(workdir / "repo"),
                    "--state-dir",
                    str(state_dir),
                    "--backend",
                    "ray",
                    "--ray-address",
                    address,
                    # The controls' positive side is itself intermittent on the demo; _faults
                    # runs them through Ray separately, without making this run depend on them.
                    "--no-controls",
                ],
                prog_name="bisect",
                standalone_mode=False,
            )
        finally:
            stop.set()
            killer.join()
        contents = journal_mod.read(journal)
        # the server lifetimes (the demo's op check narrows on the driver first: no node)
        obs = [o for o in contents.observations if o.get("tier") != "narrow"]
        ids = [o["lifetime_id"] for o in contents.observations]
        summary = (contents.end or {}).get("summary", {})
        killed = [o for o in obs if o["lifetime_id"] == result["killed_lifetime"]]
        result.update(
            state=(contents.end or {}).get("state"),
            flip_commit=summary.get("flip_commit"),
            planted_commit=history.planted_commit,
            lifetimes=len(obs),
            nodes=sorted({(o["detail"].get("ray") or {}).get("node_id", "") for o in obs}),
            worker_node_id=worker_node,
            lifetime_ids_unique=len(ids) == len(set(ids)),
            killed_lifetime_count=len(killed),
            killed_lifetime_node=(killed[0]["detail"].get("ray") or {}).get("node_id")
            if killed
            else None,
            attempts=[(o["detail"].get("ray") or {}).get("attempts") for o in obs],
            killed_lifetime_pids=sorted(
                {str((o["detail"].get("ray") or {}).get("pid")) for o in killed}
            ),
        )
        result.update(_faults(workdir, recipe, history.bad_tag))
    except BaseException as exc:  # reported to the test, which shows it
        result["error"] = f"{type(exc).__name__}: {exc}"
    out.write_text(json.dumps(result, indent=2))


def drive_crash(workdir: Path, address: str, out: Path) -> None:
    """Inside the namespace: start a Ray bisect as its own process, kill -9 it while lifetimes
    run, resume it, and compare the journals."""
    from bisect_tool import journal as journal_mod
    from bisect_tool.demo.history import generate

    result: dict[str, Any] = {"error": ""}
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        history = generate(workdir / "repo", seed=0, commits=80)
        recipe = _demo_recipe(workdir)
        state = workdir / "state"
        journal = state / journal_mod.JOURNAL_NAME
        common = ["--repo", str(workdir / "repo"), "--state-dir", str(state)]
        driver = subprocess.Popen(
            [sys.executable, "-m", "bisect_tool", "start", "--good", history.good_tag, "--bad",
             history.bad_tag, "--recipe", str(recipe), "--backend", "ray", "--ray-address",
             address, "--no-controls", *common],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        session = ""
        in_flight: list[str] = []
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and driver.poll() is None:
            if journal.exists() and journal.read_text().count('"type": "observation"') >= 2:
                session = session or str(journal_mod.read(journal).header["session"])
                # servers only: a source build carries the session label too, not a lifetime id
                in_flight = sorted(
                    {_env_of(p, "BISECT_LIFETIME") for p in _servers_of(session)} - {""}
                )
                if in_flight:
                    break
            time.sleep(0.1)
        os.kill(driver.pid, signal.SIGKILL)
        result["killed_rc"] = driver.wait()
        result["in_flight"] = in_flight
        before = journal.read_bytes()
        whole = before[: before.rfind(b"\n") + 1]  # a line torn by the kill is not kept
        result["observations_at_kill"] = len(journal_mod.read(journal).observations)
        resumed = subprocess.run(
            [sys.executable, "-m", "bisect_tool", "resume", *common],
            capture_output=True, text=True, timeout=240,
        )
        result["resume_rc"] = resumed.returncode
        result["resume_err"] = resumed.stderr[-2000:]
        after = journal.read_bytes()
        contents = journal_mod.read(journal)
        obs = contents.of_type("observation")
        ids = [o["lifetime_id"] for o in obs]
        summary = (contents.end or {}).get("summary", {})
        result.update(
            prefix_kept=after.startswith(whole),
            lifetime_ids_unique=len(ids) == len(set(ids)),
            in_flight_counts={lid: ids.count(lid) for lid in in_flight},
            observations=len(obs),
            resume_said=[ln for ln in resumed.stderr.splitlines() if ln.startswith("ended ")],
            state=(contents.end or {}).get("state"),
            flip_commit=summary.get("flip_commit"),
            planted_commit=history.planted_commit,
            leftover_servers=len(_servers_of(session)),
        )
    except BaseException as exc:  # reported to the test, which shows it
        result["error"] = f"{type(exc).__name__}: {exc}"
    out.write_text(json.dumps(result, indent=2))


def drive_spread(workdir: Path, address: str, out: Path) -> None:
    """Inside the namespace, on one node of 2 GPUs: the demo's bad end, 8 lifetimes through
    RayEvaluator with ``lifetimes_per_gpu = 2``, 4 at once; what the cluster had free while
    they ran, which GPU each ran on, and how often its swap set was put in the object store."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    import ray as ray_mod

    from bisect_tool.artifacts import make_provider
    from bisect_tool.demo.history import generate
    from bisect_tool.evaluate.ray import ray_evaluator
    from bisect_tool.recipes import recipe as recipe_mod

    result: dict[str, Any] = {"error": ""}
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        history = generate(workdir / "repo", seed=0, commits=60)
        recipe = recipe_mod.load(str(_demo_recipe(workdir)))
        recipe = dataclasses.replace(recipe, runtime=dataclasses.replace(
            recipe.runtime, lifetimes_per_gpu=2, ray_address=address))
        sha = subprocess.run(
            ["git", "-C", str(workdir / "repo"), "rev-parse", f"{history.bad_tag}^{{commit}}"],
            capture_output=True, text=True, check=True).stdout.strip()
        with (make_provider(recipe.artifacts, workdir / "repo", log_dir=workdir / "logs")
              as provider, ray_evaluator(provider, recipe, session="spread", tags={}) as ev):
            result["parallel"] = ev.parallel
            least = [2.0]
            done = threading.Event()

            def watch() -> None:
                while not done.wait(0.05):
                    least[0] = min(least[0], ray_mod.available_resources().get("GPU", 0.0))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            with ThreadPoolExecutor(4) as threads:
                seen = list(threads.map(lambda i: ev.evaluate(sha, f"{sha[:12]}-{i}"), range(8)))
            done.set()
            watcher.join()
            result.update(
                least_free_gpus=least[0],
                verdicts=sorted({str(o.verdict) for o in seen}),
                gpus=sorted({",".join(map(str, (o.detail.get("ray") or {}).get("gpus") or []))
                             for o in seen}),
                shipped=ev.shipped,
            )
    except BaseException as exc:  # reported to the test, which shows it
        result["error"] = f"{type(exc).__name__}: {exc}"
    out.write_text(json.dumps(result, indent=2))


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_lifetimes_share_a_ray_nodes_gpus_two_a_gpu(tmp_path: Path) -> None:
    """Issue 44 on a local Ray cluster (one node, 2 logical GPUs): with lifetimes_per_gpu = 2
    each lifetime's task asks half a GPU, so 4 run at once and the cluster's GPUs are all taken
    while they do; every GPU hosts lifetimes; the swap set is put in the object store once for
    all 8."""
    result = run_on_cluster(tmp_path, worker=False, extra="spread")
    print(json.dumps(result, indent=1))
    assert result["error"] == "", result["error"]
    assert result["parallel"] == 4 and result["least_free_gpus"] == 0.0
    assert result["gpus"] == ["0", "1"] and result["shipped"] == 1
    assert set(result["verdicts"]) <= {"clean", "divergent", "inconclusive"}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["drive", "crash", "spread"])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    {"crash": drive_crash, "spread": drive_spread}.get(args.mode, drive)(
        args.workdir, args.address, args.out)


def test_the_controls_on_a_ray_node_honour_the_recipes_attempts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A Ray task's controls are built as a single host's are (one wiring): the positive
    control is retried ``control_attempts`` times, not the runner's default of 3."""
    from contextlib import contextmanager

    from bisect_tool.evaluate import ray as ray_mod
    from bisect_tool.interfaces import ProbeResult, ServerHandle
    from bisect_tool.recipes.recipe import ProbeSettings, RuntimeSettings
    from bisect_tool.values import Verdict

    boots: list[str] = []

    class NeverDiverges:
        def run(self, server: ServerHandle, is_alive: object = None) -> ProbeResult:
            return ProbeResult(Verdict.CLEAN, {}, "clean")

    class Node:
        probe_factory = staticmethod(lambda sequential: NeverDiverges())

        def _swap(self, commit: str, tags: object = ()) -> SwapSet:
            return SwapSet(commit, {})

        def gate(self, swap: SwapSet) -> None:
            return None

        @contextmanager
        def boot(self, swap: SwapSet, lid: str, env: object, gpu_lease: object = None) -> Any:
            boots.append(lid)
            yield ServerHandle("http://127.0.0.1:1", lid, tmp_path / "log")

    monkeypatch.setattr(ray_mod, "_node_evaluator", lambda *args: Node())
    monkeypatch.setattr(ray_mod, "unpack_swap", lambda shipped: SwapSet(shipped.commit, {}))
    monkeypatch.setattr(ray_mod, "_where", lambda: {})
    shipped = ray_mod.ShippedSwap("c" * 40, ())
    entry = ray_mod.run_controls_task(
        RuntimeSettings(), ProbeSettings(control_attempts=2), "s", shipped
    )
    assert entry["type"] == "controls" and entry["ok"] is False
    assert entry["attempts"] == 2 and len(boots) == 2

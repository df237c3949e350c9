"""The local backend, for real: a stdlib HTTP server booted from a pinned package as a child
process group, the candidate's compiled library placed through a private overlay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import PYTHON, Libraries, sha256, tree_state

from bisect_tool.errors import BootFailed, IncompatibleExtension, RecipeError
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.recipes.recipe import RuntimeSettings
from bisect_tool.runtime import LocalBackend, make_backend
from bisect_tool.runtime.local import pids_with_env


def settings_for(site: Path, **over: object) -> RuntimeSettings:
    base: dict[str, object] = {
        "backend": "local",
        "python": PYTHON,
        "pinned_package_dir": str(site),
        "server_module": "demopkg.server",
        "env": {"RECIPE_VAR": "from-recipe"},
        "boot_timeout_s": 60.0,
    }
    base.update(over)
    return RuntimeSettings(**base)  # type: ignore[arg-type]


def spec_for(session: str, lib: Path, n: int = 0, **over: object) -> LifetimeSpec:
    swap = SwapSet(commit="c0ffee" * 7, files={"demopkg/_kernels.so": lib})
    return LifetimeSpec(session=session, lifetime_id=f"c0ffeec0ffee-{n}", swap=swap, **over)  # type: ignore[arg-type]


def gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a parent that is not us."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture()
def session() -> str:
    return f"test-rt-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def overlays(tmp_path: Path) -> Path:
    path = tmp_path / "overlays"
    path.mkdir()
    return path


def backend_for(site: Path, session: str, tmp_path: Path, overlays: Path, **over: object):
    return LocalBackend(
        settings_for(site, **over),
        session=session,
        log_dir=tmp_path / "logs",
        grace_s=5.0,
        overlay_parent=overlays,
    )


def test_server_sees_the_candidate_file_and_pinned_install_is_untouched(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, overlays: Path
) -> None:
    before = tree_state(pinned_site)
    backend = backend_for(pinned_site, session, tmp_path, overlays, model="rel-model")
    spec = spec_for(
        session,
        kernel_libraries.same,
        gpu="3",
        env={"SPEC_VAR": "from-spec", "TEST_SERVER_CHILD": "1"},
    )
    with backend.lifetime(spec) as server:
        assert server.url.startswith("http://127.0.0.1:")
        seen = httpx.get(f"{server.url}/whoami", timeout=10).json()
        assert server.is_alive()
    assert seen["sha256"] == sha256(kernel_libraries.same)
    assert seen["sha256"] != sha256(pinned_site / "demopkg" / "_kernels.so")
    assert seen["cuda"] == "3"
    assert (seen["recipe_env"], seen["spec_env"]) == ("from-recipe", "from-spec")
    assert seen["lifetime"] == spec.lifetime_id
    assert seen["host"] == "127.0.0.1"
    assert seen["model"] == "rel-model"
    # Torn down: the server and the child it started (same process group), and the overlay.
    assert gone(seen["pid"]) and gone(seen["child"])
    assert list(overlays.iterdir()) == []
    assert tree_state(pinned_site) == before
    assert "test server starting" in server.log_tail()
    assert server.log_path.parent == tmp_path / "logs"


def test_package_location_is_asked_of_the_pinned_python(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, overlays: Path
) -> None:
    backend = backend_for(
        pinned_site,
        session,
        tmp_path,
        overlays,
        pinned_package_dir="",
        env={"PYTHONPATH": str(pinned_site)},
    )
    assert backend.package_dir("demopkg") == pinned_site / "demopkg"
    with backend.lifetime(spec_for(session, kernel_libraries.same)) as server:
        seen = httpx.get(f"{server.url}/whoami", timeout=10).json()
    assert seen["sha256"] == sha256(kernel_libraries.same)
    with pytest.raises(RecipeError, match="cannot find package 'nosuchpkg'"):
        backend.package_dir("nosuchpkg")


def test_server_killed_mid_lifetime_is_seen_and_torn_down(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, overlays: Path
) -> None:
    backend = backend_for(pinned_site, session, tmp_path, overlays)
    with backend.lifetime(spec_for(session, kernel_libraries.same)) as server:
        pid = httpx.get(f"{server.url}/whoami", timeout=10).json()["pid"]
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            if not server.is_alive():
                break
            time.sleep(0.05)
        assert not server.is_alive()
    assert gone(pid)
    assert list(overlays.iterdir()) == []


def test_server_exiting_before_health_fails_fast_with_log_tail(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, overlays: Path
) -> None:
    # A deadline of an hour: only failing fast on the exit lets this test finish.
    backend = backend_for(pinned_site, session, tmp_path, overlays, boot_timeout_s=3600.0)
    spec = spec_for(session, kernel_libraries.same, env={"TEST_SERVER_MODE": "exit"})
    with pytest.raises(BootFailed) as caught, backend.lifetime(spec):
        pytest.fail("a server that exits must not be yielded")
    message = str(caught.value)
    assert "exited with code 3 before /health" in message
    assert "boom: cannot load kernels" in message
    assert list(overlays.iterdir()) == []
    assert pids_with_env("BISECT_SESSION", session) == []


def test_server_never_healthy_fails_at_the_deadline_and_is_killed(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, overlays: Path
) -> None:
    backend = backend_for(pinned_site, session, tmp_path, overlays, boot_timeout_s=1.0)
    spec = spec_for(session, kernel_libraries.same, env={"TEST_SERVER_MODE": "unhealthy"})
    with pytest.raises(BootFailed, match="not healthy after 1 s"), backend.lifetime(spec):
        pass
    assert pids_with_env("BISECT_SESSION", session) == []


def test_server_ignoring_sigterm_is_killed(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, overlays: Path
) -> None:
    backend = LocalBackend(
        settings_for(pinned_site),
        session=session,
        log_dir=tmp_path / "logs",
        grace_s=0.5,
        overlay_parent=overlays,
    )
    spec = spec_for(session, kernel_libraries.same, env={"TEST_SERVER_MODE": "ignore_term"})
    with backend.lifetime(spec) as server:
        pid = httpx.get(f"{server.url}/whoami", timeout=10).json()["pid"]
    assert gone(pid)


def test_lost_port_race_boots_again(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, overlays: Path
) -> None:
    backend = backend_for(pinned_site, session, tmp_path, overlays)
    marker = tmp_path / "port-marker"
    spec = spec_for(
        session,
        kernel_libraries.same,
        env={"TEST_SERVER_MODE": "port_taken_once", "TEST_PORT_MARKER": str(marker)},
    )
    with backend.lifetime(spec) as server:
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    log = server.log_path.read_text()
    assert log.count("== bisect lifetime") == 2
    assert "Address already in use" in log


DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from bisect_tool.interfaces import LifetimeSpec, SwapSet
    from bisect_tool.recipes.recipe import RuntimeSettings
    from bisect_tool.runtime import make_backend

    cfg = json.loads(sys.argv[1])
    settings = RuntimeSettings(**cfg["settings"])
    backend = make_backend(settings, session=cfg["session"], log_dir=Path(cfg["log_dir"]),
                           **({"docker_client": None} if cfg.get("docker") else {}))
    swap = SwapSet(commit="c0ffee" * 7, files={k: Path(v) for k, v in cfg["files"].items()})
    spec = LifetimeSpec(session=cfg["session"], lifetime_id="c0ffeec0ffee-9", swap=swap,
                        env=cfg.get("env", {}))
    with backend.lifetime(spec) as server:
        print("READY", server.url, flush=True)
        time.sleep(600)
    """
)


def run_driver(cfg: Mapping[str, object], tmp_path: Path, sig: int) -> tuple[int, str, str]:
    """Start the driver, wait for its lifetime, send ``sig``; (exit code, url, stderr)."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "TMPDIR": str(tmp_path / "drivertmp")}
    (tmp_path / "drivertmp").mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(script), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(Path(__file__).parent.parent),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), proc.stderr.read() if proc.stderr else line
        url = line.split()[1]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, url, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_the_tool_mid_lifetime_leaves_no_process(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, sig: int
) -> None:
    settings = settings_for(pinned_site)
    cfg = {
        "settings": {
            "backend": "local",
            "python": settings.python,
            "pinned_package_dir": settings.pinned_package_dir,
            "server_module": settings.server_module,
            "boot_timeout_s": 60.0,
        },
        "session": session,
        "log_dir": str(tmp_path / "logs"),
        "files": {"demopkg/_kernels.so": str(kernel_libraries.same)},
        "env": {"TEST_SERVER_CHILD": "1"},
    }
    before = tree_state(pinned_site)
    code, url, err = run_driver(cfg, tmp_path, sig)
    assert code != 0
    expected = "KeyboardInterrupt" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert expected in err
    assert pids_with_env("BISECT_SESSION", session) == []
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)
    assert list((tmp_path / "drivertmp").iterdir()) == []
    assert tree_state(pinned_site) == before


def test_cleanup_stale_kills_leftover_server_groups(
    tmp_path: Path, pinned_site: Path, session: str, overlays: Path
) -> None:
    # What a run killed with SIGKILL leaves: a server group carrying its session, an overlay dir.
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, "BISECT_SESSION": session},
        start_new_session=True,
    )
    (overlays / f"bisect-overlay-{session}-c0ffee-1-abc").mkdir()
    other = overlays / "bisect-overlay-othersession-c0ffee-1-abc"
    other.mkdir()
    try:
        backend = backend_for(pinned_site, session, tmp_path, overlays)
        assert backend.cleanup_stale(session) == 2
        assert leftover.wait(timeout=30) == -signal.SIGKILL
        assert [p.name for p in overlays.iterdir()] == [other.name]
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()


def test_compatibility_gate_on_real_libraries(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, overlays: Path
) -> None:
    backend = backend_for(pinned_site, session, tmp_path, overlays)

    def swap(lib: Path) -> SwapSet:
        return SwapSet(commit=lib.parent.name * 4, files={"demopkg/_kernels.so": lib})

    backend.check_compatible(swap(kernel_libraries.same))  # extra op: fine
    with pytest.raises(
        IncompatibleExtension, match=r"op _C::rms_norm changed: pinned '.*Tensor\? weight"
    ):
        backend.check_compatible(swap(kernel_libraries.changed))
    with pytest.raises(IncompatibleExtension, match="candidate lacks op _C::fused_add_rms_norm"):
        backend.check_compatible(swap(kernel_libraries.missing))
    with pytest.raises(IncompatibleExtension, match="does not load in the pinned stack"):
        backend.check_compatible(swap(kernel_libraries.broken))
    assert list(overlays.iterdir()) == []


def test_the_gate_asks_once_per_candidate_though_two_slots_ask_at_once(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries, session: str, overlays: Path
) -> None:
    """Two slots given the same candidate each ran the gate's interpreter on the H100 (7-11 s
    apiece), and a refused candidate was checked again at every ask: one check a candidate, its
    verdict kept, passed or refused."""
    from concurrent.futures import ThreadPoolExecutor

    backend = backend_for(pinned_site, session, tmp_path, overlays)
    dumps = []
    real = backend._schema_dumps

    def counted(swap: SwapSet) -> Any:
        dumps.append(swap.commit)
        return real(swap)

    backend._schema_dumps = counted  # type: ignore[method-assign]
    changed = SwapSet(commit="c" * 40, files={"demopkg/_kernels.so": kernel_libraries.changed})
    same = SwapSet(commit="s" * 40, files={"demopkg/_kernels.so": kernel_libraries.same})

    def ask(swap: SwapSet) -> str:
        try:
            backend.check_compatible(swap)
        except IncompatibleExtension as refused:
            return str(refused)
        return "ok"

    with ThreadPoolExecutor(4) as threads:
        said = list(threads.map(ask, [changed, changed, same, same]))
    assert said[2:] == ["ok", "ok"]
    assert said[0] == said[1] and "op _C::rms_norm changed" in said[0]
    assert ask(changed) == said[0]  # asked again: the same verdict, no new check
    assert sorted(dumps) == sorted([changed.commit, same.commit])


def test_make_backend_rejects_unknown_backend_and_missing_module(
    tmp_path: Path, pinned_site: Path
) -> None:
    with pytest.raises(RecipeError, match="must be local, docker or ray"):
        make_backend(RuntimeSettings(backend="kubernetes"), session="s", log_dir=tmp_path)
    backend = make_backend(
        settings_for(pinned_site, server_module=""), session="s", log_dir=tmp_path
    )
    spec = spec_for("s", pinned_site / "demopkg" / "_kernels.so")
    with pytest.raises(RecipeError, match="server_module is empty"), backend.lifetime(spec):
        pass
    missing = spec_for("s", tmp_path / "nope.so")
    with pytest.raises(RecipeError, match="missing from the cache"), backend.lifetime(missing):
        pass

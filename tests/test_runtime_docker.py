"""The Docker backend against the real engine (skipped with the reason where it cannot start):
containers of an image built from bisect-base:bookworm holding a small pinned package."""

from __future__ import annotations

import hashlib
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SERVER_SOURCE, Libraries, sha256
from test_runtime_local import run_driver

from bisect_tool.errors import BootFailed, IncompatibleExtension, InfrastructureError
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.recipes.recipe import RuntimeSettings
from bisect_tool.runtime import make_backend
from bisect_tool.runtime.docker_backend import DockerBackend, container_spec

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def pinned_image(
    docker_client: Any, base_image: str, kernel_libraries: Libraries, tmp_path_factory
) -> str:
    """bisect-base plus ``demopkg`` in /opt/pinned (a place the backend must ask for)."""
    ctx = tmp_path_factory.mktemp("image")
    pkg = ctx / "demopkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "server.py").write_text(SERVER_SOURCE)
    (pkg / "_kernels.so").write_bytes(kernel_libraries.pinned.read_bytes())
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY demopkg /opt/pinned/demopkg\nENV PYTHONPATH=/opt/pinned\n"
    )
    digest = hashlib.sha256(
        b"".join(p.read_bytes() for p in sorted(ctx.rglob("*")) if p.is_file())
    ).hexdigest()[:12]
    tag = f"bisect-test-pinned:{digest}"
    # labelled as the tool's, so that `make docker-down` may remove it (scripts/docker-down.sh)
    docker_client.images.build(path=str(ctx), tag=tag, network_mode="host", rm=True,
                               labels={"bisect.image": "bisect-test-pinned"})
    return tag


@pytest.fixture()
def session(docker_client: Any) -> Iterator[str]:
    name = f"test-rt-{uuid.uuid4().hex[:8]}"
    yield name
    # After every test: nothing of this session is left in the engine.
    left = docker_client.containers.list(
        all=True, filters={"label": ["bisect.tool=bisect", f"bisect.session={name}"]}
    )
    for container in left:
        container.remove(force=True)
    assert left == [], f"containers left behind: {[c.name for c in left]}"


def settings_for(image: str, **over: object) -> RuntimeSettings:
    base: dict[str, object] = {
        "backend": "docker",
        "image": image,
        "python": "python3",
        "server_module": "demopkg.server",
        "env": {"RECIPE_VAR": "from-recipe"},
        "shm_size": "64m",
        "boot_timeout_s": 60.0,
    }
    base.update(over)
    return RuntimeSettings(**base)  # type: ignore[arg-type]


def spec_for(session: str, lib: Path, **over: object) -> LifetimeSpec:
    swap = SwapSet(commit="c0ffee" * 7, files={"demopkg/_kernels.so": lib})
    return LifetimeSpec(session=session, lifetime_id="c0ffeec0ffee-1", swap=swap, **over)  # type: ignore[arg-type]


def test_container_serves_the_mounted_candidate_file(
    docker_client: Any, pinned_image: str, kernel_libraries: Libraries, session: str, tmp_path: Path
) -> None:
    backend = DockerBackend(
        settings_for(pinned_image, model_cache=str(tmp_path)),
        session=session,
        log_dir=tmp_path / "logs",
        docker_client=docker_client,
        grace_s=5,
    )
    spec = spec_for(session, kernel_libraries.same, env={"SPEC_VAR": "from-spec"})
    with backend.lifetime(spec) as server:
        seen = httpx.get(f"{server.url}/whoami", timeout=10).json()
        (container,) = docker_client.containers.list(
            filters={"label": f"bisect.lifetime={spec.lifetime_id}"}
        )
        attrs = container.attrs
    assert seen["sha256"] == sha256(kernel_libraries.same) != sha256(kernel_libraries.pinned)
    assert seen["kernels"] == "/opt/pinned/demopkg/_kernels.so"  # asked of the image
    assert (seen["recipe_env"], seen["spec_env"]) == ("from-recipe", "from-spec")
    assert attrs["HostConfig"]["NetworkMode"] == "host"
    assert attrs["HostConfig"]["ShmSize"] == 64 * 1024**2
    labels = attrs["Config"]["Labels"]
    assert labels["bisect.tool"] == "bisect" and labels["bisect.session"] == session
    assert labels["bisect.candidate"] == spec.swap.commit
    mounts = {m["Destination"]: m for m in attrs["Mounts"]}
    assert mounts["/opt/pinned/demopkg/_kernels.so"]["RW"] is False
    assert mounts[str(tmp_path.resolve())]["RW"] is False  # model cache, read-only
    assert "test server starting" in server.log_path.read_text()


def test_container_killed_mid_lifetime(
    docker_client: Any, pinned_image: str, kernel_libraries: Libraries, session: str, tmp_path: Path
) -> None:
    backend = DockerBackend(
        settings_for(pinned_image), session=session, log_dir=tmp_path, docker_client=docker_client
    )
    spec = spec_for(session, kernel_libraries.same)
    with backend.lifetime(spec) as server:
        (container,) = docker_client.containers.list(filters={"label": f"bisect.session={session}"})
        container.kill()
        for _ in range(200):
            if not server.is_alive():
                break
            time.sleep(0.05)
        assert not server.is_alive()


def test_container_exiting_before_health_fails_fast_with_log_tail(
    docker_client: Any, pinned_image: str, kernel_libraries: Libraries, session: str, tmp_path: Path
) -> None:
    backend = DockerBackend(
        settings_for(pinned_image, boot_timeout_s=3600.0),
        session=session,
        log_dir=tmp_path,
        docker_client=docker_client,
    )
    spec = spec_for(session, kernel_libraries.same, env={"TEST_SERVER_MODE": "exit"})
    with pytest.raises(BootFailed) as caught, backend.lifetime(spec):
        pytest.fail("a container that exits must not be yielded")
    assert "exited with code 3 before /health" in str(caught.value)
    assert "boom: cannot load kernels" in str(caught.value)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_the_tool_mid_lifetime_leaves_no_container(
    docker_client: Any,
    pinned_image: str,
    kernel_libraries: Libraries,
    session: str,
    tmp_path: Path,
    sig: int,
) -> None:
    cfg = {
        "settings": {
            "backend": "docker",
            "image": pinned_image,
            "server_module": "demopkg.server",
            "shm_size": "64m",
            "boot_timeout_s": 60.0,
        },
        "session": session,
        "log_dir": str(tmp_path / "logs"),
        "files": {"demopkg/_kernels.so": str(kernel_libraries.same)},
        "docker": True,
    }
    code, url, err = run_driver(cfg, tmp_path, sig)
    assert code != 0
    assert ("KeyboardInterrupt" if sig == signal.SIGINT else "terminated (SIGTERM)") in err
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)
    # the session fixture asserts that no labelled container is left


def test_gpu_device_request(
    docker_client: Any, pinned_image: str, kernel_libraries: Libraries, session: str, tmp_path: Path
) -> None:
    settings = settings_for(pinned_image)
    spec = spec_for(session, kernel_libraries.same, gpu="1")
    kwargs = container_spec(
        settings,
        spec,
        port=12345,
        targets={"demopkg/_kernels.so": "/opt/pinned/demopkg/_kernels.so"},
    )
    # The engine records what was asked; creating works without a GPU, starting would not.
    container = docker_client.containers.create(**kwargs)
    try:
        container.reload()
        (request,) = container.attrs["HostConfig"]["DeviceRequests"]
        assert request["DeviceIDs"] == ["1"] and request["Capabilities"] == [["gpu"]]
    finally:
        container.remove(force=True)
    # Here (no NVIDIA runtime) a GPU lifetime is the machine's failure, never the candidate's.
    backend = DockerBackend(
        settings, session=session, log_dir=tmp_path, docker_client=docker_client
    )
    with pytest.raises(InfrastructureError, match="Docker engine"), backend.lifetime(spec):
        pass


def test_compatibility_gate_runs_in_the_image(
    docker_client: Any, pinned_image: str, kernel_libraries: Libraries, session: str, tmp_path: Path
) -> None:
    backend = DockerBackend(
        settings_for(pinned_image), session=session, log_dir=tmp_path, docker_client=docker_client
    )

    def swap(lib: Path) -> SwapSet:
        return SwapSet(commit=lib.parent.name * 4, files={"demopkg/_kernels.so": lib})

    backend.check_compatible(swap(kernel_libraries.same))
    with pytest.raises(IncompatibleExtension, match="op _C::rms_norm changed"):
        backend.check_compatible(swap(kernel_libraries.changed))
    with pytest.raises(IncompatibleExtension, match="candidate lacks op _C::fused_add_rms_norm"):
        backend.check_compatible(swap(kernel_libraries.missing))


def test_cleanup_stale_removes_labelled_containers(
    docker_client: Any, pinned_image: str, session: str, tmp_path: Path
) -> None:
    for n in range(2):
        docker_client.containers.create(
            pinned_image,
            ["true"],
            network_mode="host",
            labels={"bisect.tool": "bisect", "bisect.session": session, "bisect.lifetime": str(n)},
        )
    backend = DockerBackend(
        settings_for(pinned_image), session=session, log_dir=tmp_path, docker_client=docker_client
    )
    assert backend.cleanup_stale(session) == 2


def test_engine_down_is_an_infrastructure_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(InfrastructureError, match="make docker-up"):
        make_backend(settings_for("any"), session="s", log_dir=tmp_path)

"""GPUs in containers without the NVIDIA container toolkit (``[runtime] docker_gpu``).

The host is a fake one (a /dev of real device nodes made with mknod where root may, a /proc
with the driver's files, a driver library directory with the usual symlinks, ``ldconfig -p``
output): the only fake is the GPU. The container spec is checked exactly as it goes to the
docker SDK, then created and started by the real engine, where a process inside lists what it
got.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.types
import pytest

from bisect_tool.errors import InfrastructureError, RecipeError
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.recipes.recipe import RuntimeSettings
from bisect_tool.runtime import gpu_passthrough as gp
from bisect_tool.runtime.docker_backend import DockerBackend, container_spec

VERSION = "580.159.04"
UUID0 = "GPU-0a0a0a0a-0000-0000-0000-000000000000"
UUID1 = "GPU-1b1b1b1b-1111-1111-1111-111111111111"


def _node(path: Path) -> None:
    """A character device (that of /dev/null) where root may make one, else a plain file."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        path.write_text("")


class FakeHost:
    def __init__(self, root: Path) -> None:
        self.root = root
        dev = root / "dev"
        (dev / "nvidia-caps").mkdir(parents=True)
        for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1",
                     "nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2", "null"):
            _node(dev / name)
        self.dev = dev
        proc = root / "proc" / "driver" / "nvidia"
        (proc / "gpus" / "0000:18:00.0").mkdir(parents=True)
        (proc / "gpus" / "0000:3a:00.0").mkdir(parents=True)
        (proc / "version").write_text(
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {VERSION}  Release Build\n"
            "GCC version:  gcc version 12.3.0\n"
        )
        # PCI bus order (what CUDA and nvidia-smi count) differs from the minor numbers here.
        (proc / "gpus" / "0000:18:00.0" / "information").write_text(
            f"Model: \t\t NVIDIA H200\nGPU UUID: \t {UUID0}\nDevice Minor: \t 1\n"
        )
        (proc / "gpus" / "0000:3a:00.0" / "information").write_text(
            f"Model: \t\t NVIDIA H200\nGPU UUID: \t {UUID1}\nDevice Minor: \t 0\n"
        )
        lib = root / "driver" / "lib64"
        lib.mkdir(parents=True)
        for stem in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"):
            (lib / f"{stem}.{VERSION}").write_bytes(f"{stem} {VERSION}\n".encode())
            (lib / f"{stem}.1").symlink_to(f"{stem}.{VERSION}")
        (lib / "libcuda.so").symlink_to("libcuda.so.1")
        (lib / "libcuda.so.570.86.15").write_bytes(b"an older driver's leftover\n")
        (lib / "libfoo.so.1").write_bytes(b"not the driver\n")
        lib32 = root / "driver" / "lib"
        lib32.mkdir()
        (lib32 / "libcuda.so.1").write_bytes(b"32-bit\n")
        self.lib = lib
        bindir = root / "driver" / "bin"
        bindir.mkdir()
        (bindir / "nvidia-smi").write_text("#!/bin/sh\necho fake nvidia-smi\n")
        (bindir / "nvidia-smi").chmod(0o755)
        self.smi = bindir / "nvidia-smi"
        # ptxjitcompiler is left out of the loader cache: found beside the listed libraries.
        self.ldconfig = (
            "4 libs found in cache `/etc/ld.so.cache'\n"
            f"\tlibnvidia-ml.so.1 (libc6,x86-64) => {lib}/libnvidia-ml.so.1\n"
            f"\tlibfoo.so.1 (libc6,x86-64) => {lib}/libfoo.so.1\n"
            f"\tlibcuda.so.1 (libc6,x86-64) => {lib}/libcuda.so.1\n"
            f"\tlibcuda.so.1 (libc6) => {lib32}/libcuda.so.1\n"
            f"\tlibcuda.so (libc6,x86-64) => {lib}/libcuda.so\n"
        )

    def view(self, *, ldconfig: str | None = None, loader_path: str = "") -> gp.HostView:
        text = self.ldconfig if ldconfig is None else ldconfig
        return gp.HostView(
            dev=self.dev,
            proc=self.root / "proc",
            ldconfig=lambda: text,
            loader_path=loader_path,
            which=lambda exe: str(self.smi) if exe == "nvidia-smi" else None,
        )


@pytest.fixture()
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host")


def settings_for(**over: Any) -> RuntimeSettings:
    base: dict[str, Any] = {
        "backend": "docker",
        "image": "bisect-base:bookworm",
        "python": "python3",
        "server_module": "demopkg.server",
        "env": {"RECIPE_VAR": "r"},
        "shm_size": "64m",
    }
    base.update(over)
    return RuntimeSettings(**base)


def spec_for(session: str, lib: Path, gpu: str | None) -> LifetimeSpec:
    swap = SwapSet(commit="c0ffee" * 7, files={"demopkg/_kernels.so": lib})
    return LifetimeSpec(session=session, lifetime_id="c0ffeec0ffee-1", swap=swap, gpu=gpu)


def expected_driver_mounts(host: FakeHost) -> list[docker.types.Mount]:
    real = {s: str((host.lib / f"{s}.{VERSION}").resolve()) for s in
            ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so")}
    names = {
        "libcuda.so": real["libcuda.so"],
        "libcuda.so.1": real["libcuda.so"],
        f"libcuda.so.{VERSION}": real["libcuda.so"],
        "libnvidia-ml.so.1": real["libnvidia-ml.so"],
        f"libnvidia-ml.so.{VERSION}": real["libnvidia-ml.so"],
        "libnvidia-ptxjitcompiler.so.1": real["libnvidia-ptxjitcompiler.so"],
        f"libnvidia-ptxjitcompiler.so.{VERSION}": real["libnvidia-ptxjitcompiler.so"],
    }
    mounts = [
        docker.types.Mount(target=f"{gp.LIB_DIR}/{n}", source=src, type="bind", read_only=True)
        for n, src in sorted(names.items())
    ]
    mounts.append(docker.types.Mount(
        target="/usr/bin/nvidia-smi", source=str(host.smi.resolve()), type="bind", read_only=True
    ))
    return mounts


def test_devices_mode_spec_is_exact(host: FakeHost, tmp_path: Path) -> None:
    lib = tmp_path / "cand.so"
    lib.write_bytes(b"candidate")
    access = gp.resolve(gp.GpuMode.DEVICES, host=host.view())
    kwargs = container_spec(
        settings_for(),
        spec_for("s1", lib, gpu="0"),
        port=12345,
        targets={"demopkg/_kernels.so": "/opt/pinned/demopkg/_kernels.so"},
        gpu_access=access,
        image_env={"LD_LIBRARY_PATH": "/opt/lib", "PATH": "/usr/bin"},
    )
    dev = host.dev
    # GPU 0 is the first on the PCI bus, whose node is nvidia1; the other GPU stays out.
    assert kwargs["devices"] == [
        f"{dev}/{n}:{dev}/{n}:rwm"
        for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                  "nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2", "nvidia1")
    ]
    assert "device_requests" not in kwargs
    assert kwargs["mounts"] == [
        docker.types.Mount(target="/opt/pinned/demopkg/_kernels.so", source=str(lib.resolve()),
                           type="bind", read_only=True),
        *expected_driver_mounts(host),
    ]
    assert all(m["ReadOnly"] for m in kwargs["mounts"])
    assert kwargs["environment"] == {
        "LD_LIBRARY_PATH": f"{gp.LIB_DIR}:/opt/lib",  # the image's own value kept after it
        "TRITON_LIBCUDA_PATH": gp.LIB_DIR,
        "RECIPE_VAR": "r",
        "BISECT_SESSION": "s1",
        "BISECT_LIFETIME": "c0ffeec0ffee-1",
    }
    assert kwargs["network_mode"] == "host"
    assert kwargs["command"][-4:] == ["--host", "127.0.0.1", "--port", "12345"]
    assert kwargs["labels"] == {
        "bisect.tool": "bisect", "bisect.session": "s1",
        "bisect.candidate": "c0ffee" * 7, "bisect.lifetime": "c0ffeec0ffee-1",
    }


def test_devices_mode_by_uuid_and_without_a_lease(host: FakeHost, tmp_path: Path) -> None:
    access = gp.resolve(gp.GpuMode.DEVICES, host=host.view())
    assert access.nodes_for(UUID1)[-1] == f"{host.dev}/nvidia0"
    assert access.nodes_for("1")[-1] == f"{host.dev}/nvidia0"
    # No GPU leased: every GPU, as a process on the host would see them.
    assert access.nodes_for(None)[-2:] == [f"{host.dev}/nvidia0", f"{host.dev}/nvidia1"]
    with pytest.raises(InfrastructureError, match="GPU '7' has no device node.*--gpus"):
        access.nodes_for("7")
    # A one-shot (package lookup, schema dump) gets the libraries and control nodes only.
    one = access.create_kwargs(None, one_shot=True)
    assert not any("nvidia0" in d or "nvidia1:" in d for d in one["devices"])
    assert one["mounts"] == expected_driver_mounts(host)


def test_a_tensor_parallel_lifetime_gets_both_its_gpus(host: FakeHost) -> None:
    """A lease of two GPUs ("0,1", issue 43) gives the container both GPUs' nodes (devices
    mode) or both ids in its device request (toolkit), none of another lifetime's."""
    access = gp.resolve(gp.GpuMode.DEVICES, host=host.view())
    assert access.nodes_for("0,1")[-2:] == [f"{host.dev}/nvidia1", f"{host.dev}/nvidia0"]
    with pytest.raises(InfrastructureError, match="GPU '7' has no device node"):
        access.nodes_for("0,7")
    toolkit = gp.resolve(gp.GpuMode.TOOLKIT, host=host.view())
    assert toolkit.create_kwargs("0,1")["device_requests"] == [
        docker.types.DeviceRequest(device_ids=["0", "1"], capabilities=[["gpu"]])
    ]


def test_libraries_found_on_the_loader_path_when_ldconfig_lists_none(host: FakeHost) -> None:
    files = gp.driver_files(host.view(ldconfig="", loader_path=f"/nonexistent:{host.lib}"))
    got = {dst.rsplit("/", 1)[1] for _, dst in files}
    assert got == {
        "libcuda.so", "libcuda.so.1", f"libcuda.so.{VERSION}",
        "libnvidia-ml.so.1", f"libnvidia-ml.so.{VERSION}",
        "libnvidia-ptxjitcompiler.so.1", f"libnvidia-ptxjitcompiler.so.{VERSION}", "nvidia-smi",
    }  # not the older driver's libcuda.so.570.86.15, not libfoo


def test_devices_mode_without_driver_says_what_to_do(host: FakeHost, tmp_path: Path) -> None:
    (host.dev / "nvidiactl").unlink()
    with pytest.raises(InfrastructureError, match="nvidiactl is missing.*toolkit"):
        gp.resolve(gp.GpuMode.DEVICES, host=host.view())
    host2 = FakeHost(tmp_path / "h2")
    with pytest.raises(InfrastructureError, match="libcuda.so was not found.*LD_LIBRARY_PATH"):
        gp.resolve(gp.GpuMode.DEVICES, host=host2.view(ldconfig="", loader_path=""))


def test_toolkit_mode_and_auto(host: FakeHost, tmp_path: Path) -> None:
    lib = tmp_path / "cand.so"
    lib.write_bytes(b"c")
    kwargs = container_spec(
        settings_for(), spec_for("s1", lib, gpu="1"), port=1,
        targets={"demopkg/_kernels.so": "/opt/pinned/demopkg/_kernels.so"},
        gpu_access=gp.resolve(gp.GpuMode.TOOLKIT, host=host.view()),
    )
    assert kwargs["device_requests"] == [
        docker.types.DeviceRequest(device_ids=["1"], capabilities=[["gpu"]])
    ]
    assert "devices" not in kwargs and len(kwargs["mounts"]) == 1
    assert set(kwargs["environment"]) == {"RECIPE_VAR", "BISECT_SESSION", "BISECT_LIFETIME"}
    # auto: the engine's nvidia runtime wins; else the driver on this host; else nothing.
    assert gp.resolve(gp.GpuMode.AUTO, host=host.view(),
                      engine_runtimes=["runc", "nvidia"]).mode is gp.GpuMode.TOOLKIT
    assert gp.resolve(gp.GpuMode.AUTO, host=host.view()).mode is gp.GpuMode.DEVICES
    (host.dev / "nvidiactl").unlink()
    assert gp.resolve(gp.GpuMode.AUTO, host=host.view()).mode is gp.GpuMode.TOOLKIT
    with pytest.raises(RecipeError, match="docker_gpu = 'cdi'; give toolkit, devices or auto"):
        gp.parse_mode("cdi")


def test_model_directory_is_mounted_read_only(tmp_path: Path) -> None:
    model = tmp_path / "models" / "random-abc"
    model.mkdir(parents=True)
    lib = tmp_path / "cand.so"
    lib.write_bytes(b"c")
    kwargs = container_spec(
        settings_for(model=str(model)), spec_for("s1", lib, gpu=None), port=1,
        targets={"demopkg/_kernels.so": "/opt/pinned/demopkg/_kernels.so"},
    )
    assert docker.types.Mount(target=str(model.resolve()), source=str(model.resolve()),
                              type="bind", read_only=True) in kwargs["mounts"]
    assert kwargs["command"][kwargs["command"].index("--model") + 1] == str(model)


# ---- the real engine: the spec is accepted, and a process inside sees exactly that ----------

LIST_SCRIPT = (
    "import os, json; d = {}\n"
    "d['dev'] = sorted(p for p in os.listdir('/dev') if p.startswith('nvidia'))\n"
    "lib = os.environ['TRITON_LIBCUDA_PATH']\n"
    "d['libs'] = sorted(os.listdir(lib))\n"
    "d['cuda'] = open(lib + '/libcuda.so.1').read().strip()\n"
    "d['ld'] = os.environ['LD_LIBRARY_PATH']\n"
    "try:\n"
    "    open(lib + '/libcuda.so.1', 'a').write('x'); d['write'] = 'allowed'\n"
    "except OSError as e:\n"
    "    d['write'] = type(e).__name__ + ':' + str(e.errno)\n"
    "print(json.dumps(d))\n"
)


@pytest.fixture()
def session(docker_client: Any) -> Iterator[str]:
    name = f"test-gpu-{uuid.uuid4().hex[:8]}"
    yield name
    left = docker_client.containers.list(
        all=True, filters={"label": ["bisect.tool=bisect", f"bisect.session={name}"]}
    )
    for container in left:
        container.remove(force=True)
    assert left == [], f"containers left behind: {[c.name for c in left]}"


@pytest.mark.docker
def test_engine_runs_the_devices_spec(
    docker_client: Any, base_image: str, host: FakeHost, session: str, tmp_path: Path
) -> None:
    if not stat.S_ISCHR((host.dev / "nvidia0").stat().st_mode):
        pytest.skip("cannot make device nodes here (needs root)")
    lib = tmp_path / "cand.so"
    lib.write_bytes(b"c")
    settings = settings_for(image=base_image, python="python3", docker_gpu="devices")
    backend = DockerBackend(settings, session=session, log_dir=tmp_path,
                            docker_client=docker_client, gpu_host=host.view())
    kwargs = container_spec(
        settings, spec_for(session, lib, gpu="0"), port=1,
        targets={"demopkg/_kernels.so": "/opt/demopkg/_kernels.so"},
        gpu_access=backend.gpu_access(), image_env=backend.image_env(),
    )
    # The lifetime's own command would start a server; here the same spec runs the lister.
    kwargs.update(entrypoint=["python3"], command=["-c", LIST_SCRIPT])
    container = docker_client.containers.create(**kwargs)
    try:
        container.start()
        assert container.wait(timeout=120)["StatusCode"] == 0
        seen = __import__("json").loads(container.logs(stdout=True, stderr=False))
        container.reload()
        attrs = container.attrs
    finally:
        container.remove(force=True)
    # Inside, the nodes keep the host's names (here the fake /dev's path, so only nvidia*
    # directly under /dev would show; the fake ones live under the host root's path).
    devices = {d["PathInContainer"] for d in attrs["HostConfig"]["Devices"]}
    assert devices == {f"{host.dev}/{n}" for n in (
        "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps/nvidia-cap1",
        "nvidia-caps/nvidia-cap2", "nvidia1")}
    assert seen["cuda"] == f"libcuda.so {VERSION}"
    assert "libcuda.so.570.86.15" not in seen["libs"] and "libcuda.so" in seen["libs"]
    assert seen["write"] == "OSError:30"  # EROFS: the driver is mounted read-only
    assert seen["ld"].split(":")[0] == gp.LIB_DIR
    assert attrs["HostConfig"]["NetworkMode"] == "host"
    mounts = {m["Destination"]: m for m in attrs["Mounts"]}
    assert all(m["RW"] is False for m in mounts.values())
    assert attrs["Config"]["Labels"]["bisect.session"] == session


@pytest.mark.docker
def test_engine_sees_device_nodes_inside(
    docker_client: Any, base_image: str, host: FakeHost, session: str, tmp_path: Path
) -> None:
    """The nodes as the real host's /dev gives them: the container can open the GPU's node."""
    if not stat.S_ISCHR((host.dev / "nvidia0").stat().st_mode):
        pytest.skip("cannot make device nodes here (needs root)")
    access = gp.resolve(gp.GpuMode.DEVICES, host=host.view())
    kwargs = access.create_kwargs("1")
    script = f"open('{host.dev}/nvidia0', 'rb').read(0); print('opened')"
    out = docker_client.containers.run(
        base_image, ["python3", "-c", script], remove=True, network_mode="host",
        labels={"bisect.tool": "bisect", "bisect.session": session}, **kwargs,
    )
    assert out.strip() == b"opened"

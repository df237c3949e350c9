"""How a container of the Docker backend gets its GPU: ``[runtime] docker_gpu``.

- ``toolkit``: a device request (``--gpus device=N``); the NVIDIA container toolkit on the engine's
  host mounts the driver and the device nodes. Today's behaviour, and the only one that works on a
  host whose driver files the tool cannot see.
- ``devices``: no toolkit on the host (the lent H200: a VM with the driver under
  /usr/local/nvidia and no toolkit). The container gets the ``/dev/nvidia*`` nodes found now (the
  control nodes, nvidia-uvm, nvidia-caps, and only the assigned GPU's own node) and the driver's
  user-space libraries bind-mounted read-only into one directory (``LIB_DIR``, the directory
  CUDA images already put on their loader path), found now from ``ldconfig -p``, the loader path
  and the driver version in /proc: never a hard-coded host path, because every host puts the
  driver somewhere else (/usr/lib/x86_64-linux-gnu, /usr/local/nvidia/lib64, /usr/lib64, ...).
- ``auto`` (default): ``toolkit`` when the engine or this host has the NVIDIA runtime, else
  ``devices`` when this host has /dev/nvidiactl, else ``toolkit`` (no GPU at all: a CPU stack
  such as the demo engine asks for nothing unless a GPU is leased).

``devices`` assumes the engine runs on this host (its local socket): the nodes and libraries
are looked up here.
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import docker.types

from bisect_tool.errors import InfrastructureError, RecipeError

# Inside the container: where the driver libraries go. nvidia/cuda-based images (the official
# vllm/vllm-openai among them) already have it on LD_LIBRARY_PATH; for others the backend adds it.
LIB_DIR = "/usr/local/nvidia/lib64"
BIN_DIR = "/usr/bin"

# The driver's user-space libraries a CUDA program can load (names, not paths): the toolkit's
# "compute" and "utility" sets. Graphics and video libraries are left out on purpose.
DRIVER_LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-cfg.so",
    "libnvidia-allocator.so",
    "libnvidia-opencl.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
)
DRIVER_BINARIES = ("nvidia-smi", "nvidia-debugdump")
# Nodes every CUDA process needs besides its GPU's own /dev/nvidiaN.
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
_GPU_NODE = re.compile(r"^nvidia(\d+)$")
_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


class GpuMode(enum.Enum):
    TOOLKIT = "toolkit"
    DEVICES = "devices"
    AUTO = "auto"


def parse_mode(value: str) -> GpuMode:
    try:
        return GpuMode(value)
    except ValueError:
        raise RecipeError(
            f"[runtime] docker_gpu = {value!r}; give toolkit, devices or auto"
        ) from None


@dataclass(frozen=True)
class HostView:
    """Where the host's GPU facts are read; tests point it at a fake /dev, /proc and ldconfig."""

    dev: Path = Path("/dev")
    proc: Path = Path("/proc")
    ldconfig: Callable[[], str] | None = None  # None: run `ldconfig -p`
    loader_path: str | None = None  # None: $LD_LIBRARY_PATH
    which: Callable[[str], str | None] = shutil.which

    def ldconfig_output(self) -> str:
        if self.ldconfig is not None:
            return self.ldconfig()
        for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
            found = shutil.which(exe) or (exe if Path(exe).is_file() else None)
            if found is None:
                continue
            try:
                proc = subprocess.run(
                    [found, "-p"], capture_output=True, text=True, timeout=30, check=False
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            return proc.stdout
        return ""

    def loader_dirs(self) -> list[Path]:
        raw = self.loader_path
        if raw is None:
            raw = os.environ.get("LD_LIBRARY_PATH", "")
        return [Path(p) for p in raw.split(":") if p]


@dataclass(frozen=True)
class GpuAccess:
    """What one container is given for its GPU (a value: the engine request is built from it)."""

    mode: GpuMode
    # devices mode: control nodes (always) and GPU id -> that GPU's node
    control_nodes: tuple[str, ...] = ()
    gpu_nodes: Mapping[str, str] = field(default_factory=dict)
    # (host file, container path), read-only
    files: tuple[tuple[str, str], ...] = ()

    def nodes_for(self, gpu: str | None) -> list[str]:
        """The nodes of ``gpu``'s GPUs ("0,1": a tensor-parallel lifetime's), and the control
        nodes."""
        if gpu is None:  # no GPU leased: every GPU, as a process on the host would see them
            return [*self.control_nodes, *sorted(set(self.gpu_nodes.values()))]
        gpus = []
        for one in gpu.split(","):
            if one not in self.gpu_nodes:
                known = ", ".join(sorted(self.gpu_nodes)) or "none"
                raise InfrastructureError(
                    f"GPU {one!r} has no device node on this host (GPUs found: {known}); "
                    "fix [runtime] gpus / --gpus"
                )
            gpus.append(self.gpu_nodes[one])
        return [*self.control_nodes, *gpus]

    def create_kwargs(self, gpu: str | None, *, one_shot: bool = False) -> dict[str, Any]:
        """Keyword arguments for ``containers.create``: the device request or the nodes; the
        library mounts go under ``"mounts"`` (the caller appends them to its own)."""
        if self.mode is GpuMode.TOOLKIT:
            if gpu is None or one_shot:
                return {}
            return {"device_requests": [
                docker.types.DeviceRequest(device_ids=gpu.split(","), capabilities=[["gpu"]])
            ]}
        # A one-shot (package lookup, schema dump) loads the extension, which links libcuda, but
        # computes nothing: the libraries and the control nodes, no GPU of anyone's lifetime.
        nodes = list(self.control_nodes) if one_shot else self.nodes_for(gpu)
        return {
            "devices": [f"{n}:{n}:rwm" for n in nodes],
            "mounts": [
                docker.types.Mount(target=dst, source=src, type="bind", read_only=True)
                for src, dst in self.files
            ],
        }

    def environment(self, image_env: Mapping[str, str], recipe_env: Mapping[str, str]) -> dict:
        """Variables the container needs to find the mounted libraries (devices mode only)."""
        if self.mode is not GpuMode.DEVICES or not self.files:
            return {}
        out: dict[str, str] = {}
        if "LD_LIBRARY_PATH" not in recipe_env:
            current = image_env.get("LD_LIBRARY_PATH", "")
            if LIB_DIR not in current.split(":"):
                # Setting it replaces the image's own value, so the image's value is kept after.
                out["LD_LIBRARY_PATH"] = ":".join(p for p in (LIB_DIR, current) if p)
        if "TRITON_LIBCUDA_PATH" not in recipe_env:
            # Triton looks for libcuda in the loader cache first, which the image built without it.
            out["TRITON_LIBCUDA_PATH"] = LIB_DIR
        return out


def resolve(
    mode: GpuMode,
    *,
    host: HostView | None = None,
    engine_runtimes: Iterable[str] = (),
) -> GpuAccess:
    """The access the mode means on this host (``auto`` decided here, once per backend)."""
    host = host or HostView()
    if mode is GpuMode.AUTO:
        toolkit = "nvidia" in set(engine_runtimes) or any(
            host.which(exe) for exe in ("nvidia-container-runtime-hook", "nvidia-ctk")
        )
        if toolkit or not (host.dev / "nvidiactl").exists():
            return GpuAccess(GpuMode.TOOLKIT)
        mode = GpuMode.DEVICES
    if mode is GpuMode.TOOLKIT:
        return GpuAccess(GpuMode.TOOLKIT)
    return discover_devices(host)


def discover_devices(host: HostView) -> GpuAccess:
    if not (host.dev / "nvidiactl").exists():
        raise InfrastructureError(
            f"[runtime] docker_gpu = 'devices' but {host.dev / 'nvidiactl'} is missing: no NVIDIA "
            "driver on this host; use docker_gpu = 'toolkit' or run where the GPU is"
        )
    control = [str(host.dev / n) for n in CONTROL_NODES if (host.dev / n).exists()]
    caps = host.dev / "nvidia-caps"
    if caps.is_dir():
        control += sorted(str(p) for p in caps.iterdir())
    nodes = {
        m.group(1): str(p)
        for p in host.dev.iterdir()
        if (m := _GPU_NODE.match(p.name))
    }
    gpu_nodes: dict[str, str] = {}
    # GPU ids as CUDA and nvidia-smi count them (PCI bus order) and by UUID, mapped to the minor
    # number of the node, which need not equal the index.
    for index, (uuid, minor) in enumerate(_proc_gpus(host.proc)):
        node = nodes.get(minor)
        if node is not None:
            gpu_nodes[str(index)] = node
            if uuid:
                gpu_nodes[uuid] = node
    for minor, node in nodes.items():  # no /proc information: index = minor number
        gpu_nodes.setdefault(minor, node)
    files = driver_files(host)
    if not any(PurePosixPath(dst).name.startswith("libcuda.so") for _, dst in files):
        raise InfrastructureError(
            "[runtime] docker_gpu = 'devices': libcuda.so was not found in `ldconfig -p`, "
            "LD_LIBRARY_PATH or beside the driver's libraries; add the driver's library "
            "directory to LD_LIBRARY_PATH or use docker_gpu = 'toolkit'"
        )
    return GpuAccess(
        GpuMode.DEVICES, control_nodes=tuple(control), gpu_nodes=gpu_nodes, files=tuple(files)
    )


def _proc_gpus(proc: Path) -> list[tuple[str, str]]:
    """(UUID, device minor) of each GPU the driver reports, in PCI bus order."""
    base = proc / "driver" / "nvidia" / "gpus"
    if not base.is_dir():
        return []
    out = []
    for bus in sorted(base.iterdir(), key=lambda p: p.name.lower()):
        try:
            text = (bus / "information").read_text()
        except OSError:
            continue
        minor = re.search(r"^Device Minor:\s*(\d+)", text, re.M)
        uuid = re.search(r"^GPU UUID:\s*(\S+)", text, re.M)
        if minor:
            out.append((uuid.group(1) if uuid else "", minor.group(1)))
    return out


def driver_version(proc: Path) -> str:
    try:
        text = (proc / "driver" / "nvidia" / "version").read_text()
    except OSError:
        return ""
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else ""


def _is_driver_library(name: str) -> bool:
    return any(name == lib or name.startswith(lib + ".") for lib in DRIVER_LIBRARIES)


def _other_version(name: str, version: str) -> bool:
    """A real file of another driver release left beside this one (libcuda.so.570.86.15)."""
    m = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)*)$", name)
    return bool(m and version and m.group(1) != version)


def driver_files(host: HostView) -> list[tuple[str, str]]:
    """(host file, container path) for the driver libraries and tools, read-only mounts.

    Each library appears under every name the loader knows (libcuda.so, libcuda.so.1) and its
    real file name (libcuda.so.580.95.05), all backed by the real file: a symlink mounted as
    such would point at a host path the container does not have.
    """
    found: dict[str, str] = {}  # container name -> host real file

    def add(name: str, path: Path) -> None:
        try:
            real = path.resolve(strict=True)
        except OSError:
            return
        if not real.is_file():
            return
        found.setdefault(name, str(real))
        found.setdefault(real.name, str(real))

    for line in host.ldconfig_output().splitlines():
        m = _LDCONFIG_LINE.match(line)
        # 64-bit entries only: "(libc6,x86-64)" / "(libc6,AArch64)"; plain "(libc6)" is 32-bit.
        if m and _is_driver_library(m.group(1)) and "64" in m.group(2):
            add(m.group(1), Path(m.group(3)))
    # The driver's own files: the loader path (where such hosts usually point at the driver)
    # and the directories already found, for the libraries ldconfig did not list; with the
    # driver's version, its real files `*.so.<version>`.
    version = driver_version(host.proc)
    dirs = [*host.loader_dirs(), *{Path(p).parent for p in found.values()}]
    for d in dict.fromkeys(dirs):
        try:
            entries = sorted(d.iterdir())
        except OSError:
            continue
        for p in entries:
            if _is_driver_library(p.name) and not _other_version(p.name, version):
                add(p.name, p)
    files = [(src, f"{LIB_DIR}/{name}") for name, src in sorted(found.items())]
    for exe in DRIVER_BINARIES:
        path = host.which(exe)
        if path:
            real = Path(path).resolve()
            if real.is_file():
                files.append((str(real), f"{BIN_DIR}/{exe}"))
    return files

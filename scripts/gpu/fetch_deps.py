#!/usr/bin/env python3
"""Download the wheels the pinned vLLM Python side needs but the GPU machine's image lacks.

Run here (the machine with internet), not on the device:

    .venv/bin/python scripts/gpu/fetch_deps.py /work/wheels/vllm-0.26.0-...whl --dest DIR

It reads the vLLM wheel's METADATA Requires-Dist, drops what the device image already holds
(``device-packages.txt`` beside this file, copied from the workplace's KINDS.md package list) and
the torch-family / GPU-kernel pins that the Qwen3 FLASH_ATTN path does not import at boot (see
/work/shared/vllm-facts.md: "The torch-family and flashinfer pins can be left out for this
check"), then downloads each remaining requirement with ``pip download --no-deps`` for CPython
3.12 manylinux x86_64, reads that wheel's own Requires-Dist (markers evaluated for Linux x86_64
Python 3.12, with the extras asked for) and repeats until nothing new is needed. ``--no-deps``
throughout because pip on this machine (Python 3.11) must not resolve against itself.

Prints one line per wheel and a summary; exits 1 if a requirement had no matching wheel.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent

# Pins left out on purpose: the torch family must stay the device's own build (torch
# 2.11.0+cu130), and these GPU-kernel / media packages are imported lazily, only by backends or
# models the Qwen3 + FLASH_ATTN check never reaches (checked with grep over the 0.26.0 wheel:
# no module-level import on the server's boot path). Several are hundreds of MB.
SKIP = {
    "torch", "torchaudio", "torchvision", "torchcodec", "pynvvideocodec", "xformers",
    "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "apache-tvm-ffi",
    "tilelang", "nvidia-cudnn-frontend", "nvtx", "fastsafetensors", "nvidia-cutlass-dsl",
    "quack-kernels", "tokenspeed-mla", "humming-kernels", "triton",
    # fastapi[standard] pulls the `fastapi` command-line tools (and their cloud client: sentry-sdk,
    # rignore, fastar, ...); vLLM serves through uvicorn directly and never imports them.
    "fastapi-cli", "fastapi-cloud-cli",
}

PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "linux_x86_64", "any"]

ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
    "platform_python_implementation": "CPython", "implementation_name": "cpython",
    "platform_release": "", "platform_version": "", "implementation_version": "3.12.3",
}


def device_packages() -> set[str]:
    lines = (HERE / "device-packages.txt").read_text().splitlines()
    return {canonicalize_name(n.strip()) for n in lines if n.strip() and not n.startswith("#")}


def requires(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode("utf-8", "replace").splitlines()
    out: list[Requirement] = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None:
            marker: Marker = req.marker
            if not any(marker.evaluate({**ENV, "extra": e}) for e in (extras or {""})):
                continue
        out.append(req)
    return out


def download(name: str, spec: SpecifierSet, dest: Path) -> Path | None:
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
           "--abi", "abi3", "--abi", "none", "-d", str(dest)]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    cmd.append(f"{name}{spec}")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(f"  ! {name}{spec}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    new = set(dest.glob("*.whl")) - before
    if new:
        return new.pop()
    # already there from an earlier run
    stem = canonicalize_name(name).replace("-", "_")
    for whl in dest.glob("*.whl"):
        if canonicalize_name(whl.name.split("-")[0]).replace("-", "_") == stem:
            return whl
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("vllm_wheel", type=Path)
    p.add_argument("--dest", type=Path, required=True)
    p.add_argument("--also", nargs="*", default=[], help="extra top-level requirements")
    args = p.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    present = device_packages()
    specs: dict[str, SpecifierSet] = {}
    extras: dict[str, set[str]] = {}
    queue: list[str] = []
    done: set[str] = set()
    failed: list[str] = []
    wheels: dict[str, Path] = {}

    def want(req: Requirement, parent: str) -> None:
        name = canonicalize_name(req.name)
        if name in present or name in SKIP or name == "vllm":
            return
        specs[name] = specs.get(name, SpecifierSet()) & req.specifier
        new_extras = set(req.extras) - extras.get(name, set())
        extras.setdefault(name, set()).update(req.extras)
        if name not in done and name not in queue:
            queue.append(name)
        elif name in done and new_extras:
            done.discard(name)  # re-read its metadata with the new extras
            queue.append(name)

    for req in requires(args.vllm_wheel, set()):
        want(req, "vllm")
    for extra in args.also:
        want(Requirement(extra), "cli")
    while queue:
        name = queue.pop(0)
        done.add(name)
        whl = wheels.get(name) or download(name, specs[name], args.dest)
        if whl is None:
            failed.append(f"{name}{specs[name]}")
            continue
        wheels[name] = whl
        for req in requires(whl, extras.get(name, set())):
            want(req, name)
    total = 0
    for name in sorted(wheels):
        size = wheels[name].stat().st_size
        total += size
        print(f"{size:>10}  {wheels[name].name}")
    print(f"{len(wheels)} wheels, {total} bytes; skipped as on device or left out: "
          f"{len(present)} + {len(SKIP)} names")
    for f in failed:
        print(f"NO WHEEL: {f}")
    # Two versions of one name stop `pip install --no-index` on the device.
    stems = [re.sub(r"[-_.]+", "_", w.name.split("-")[0]).lower() for w in args.dest.glob("*.whl")]
    dupes = sorted({s for s in stems if stems.count(s) > 1})
    if dupes:
        print(f"DUPLICATE names in {args.dest}: {dupes}")
    return 1 if failed or dupes else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Build the pinned image offline from this machine's own stack, and check CUDA inside it.

Runs ON THE GPU MACHINE (called by docker_setup.sh), through the docker SDK that `bisect` uses
(no docker CLI is carried). Also runs here against the local engine with a stand-in stack
(tests of the scripts: `--root` points at a fake root, `--check none`).

    docker_image.py build --tag bisect-pinned:0.26.0 --pinned /tmp/dev/site --pinned /tmp/dev/deps
    docker_image.py check --tag bisect-pinned:0.26.0 [--check cuda|python|none] [--json FILE]

build: one `docker import` of a tar stream of what the local backend runs on this machine:
the interpreter (its venv ``sys.prefix`` and ``sys.base_prefix``), the system it needs (/usr,
/etc and the /bin, /lib links), and the pinned packages placed at /opt/pinned/<name> (on
PYTHONPATH), minus named packages the vLLM server never imports (JAX, CuPy, ONNX, ...; --full
keeps everything). Left out always: the CUDA toolkit and the driver (/usr/local/cuda*,
/usr/local/nvidia: torch uses its own CUDA wheels, and the driver is mounted per container by
[runtime] docker_gpu = "devices"), docs, caches, /proc, /sys, /dev, /tmp.

check: one container with the same GPU access the backend gives a lifetime (bisect_tool's
gpu_passthrough, mode devices), printing torch.cuda's view and importing the pinned vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Big packages of the device image that the vLLM OpenAI server's boot path never imports.
UNUSED = (
    "jax", "jaxlib", "jax_cuda13_plugin", "jax_cuda13_pjrt", "jax_plugins", "cupy",
    "cupy_backends", "cupyx", "cupy_cuda13x", "onnxruntime", "onnx", "onnxscript", "onnx_ir",
    "tensorboard", "tensorboard_data_server", "tensorstore", "torch_geometric", "torchaudio",
    "flax", "optax", "orbax", "orbax_checkpoint", "chex", "botorch", "gpytorch",
    "linear_operator", "numpyro", "lightning", "pytorch_lightning", "lightning_utilities",
    "sentence_transformers", "timm", "pyarrow", "mpi4py", "skimage", "scikit_image",
    "statsmodels", "xarray", "e3nn", "diffrax", "equinox", "lineax", "optimistix", "pyro",
)
SYSTEM = ("usr", "etc", "bin", "sbin", "lib", "lib64", "lib32", "libx32", "var/lib/dpkg")
NEVER = (
    "usr/local/cuda", "usr/local/cuda-*", "usr/local/nvidia", "usr/share/doc", "usr/share/man",
    "usr/share/info", "usr/share/locale", "usr/src", "usr/include/c++/*/experimental",
    "*/__pycache__", "opt/nvidia", "usr/lib/firmware", "usr/lib/modules",
)
PASS_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def log(msg: str) -> None:
    print(f"[docker_image] {msg}", flush=True)


def interpreter_facts(python: str) -> dict[str, str]:
    code = ("import sys, sysconfig, json; print(json.dumps({'prefix': sys.prefix, "
            "'base': sys.base_prefix, 'purelib': sysconfig.get_paths()['purelib'], "
            "'exe': sys.executable}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def build(args: argparse.Namespace) -> int:
    import docker

    root = Path(args.root)
    facts = interpreter_facts(args.python)
    log(f"interpreter {facts['exe']} prefix {facts['prefix']} base {facts['base']}")
    system = [m for m in args.system.split(",") if m.strip("/.")] if args.system else list(SYSTEM)
    members = [m for m in system if (root / m).exists() or (root / m).is_symlink()]
    if not args.system:  # the interpreter's own trees, wherever they are (a venv under /opt)
        for p in (facts["prefix"], facts["base"]):
            rel = os.path.relpath(p, "/")
            if not any(rel == m or rel.startswith(m + "/") for m in members):
                members.append(rel)
    excludes = [*NEVER]
    site = os.path.relpath(facts["purelib"], "/")
    if not args.full:
        for name in UNUSED:
            excludes += [f"{site}/{name}", f"{site}/{name}-*.dist-info", f"{site}/{name}.libs"]
    skel = Path(tempfile.mkdtemp(prefix="bisect-skel-"))
    for d in ("tmp", "var/tmp", "proc", "sys", "dev", "run", "root", "opt/pinned"):
        (skel / d).mkdir(parents=True, exist_ok=True)
    (skel / "tmp").chmod(0o1777)
    (skel / "var/tmp").chmod(0o1777)
    cmd = ["tar", "--numeric-owner", "--one-file-system", "-cf", "-"]
    cmd += [f"--exclude=./{e}" if not e.startswith("*") else f"--exclude={e}" for e in excludes]
    cmd += ["-C", str(skel), "."]
    cmd += ["-C", str(root), *[f"./{m}" for m in members]]
    pinned = []
    for p in args.pinned:
        src = Path(p).resolve()
        dst = f"/opt/pinned/{src.name}"
        pinned.append(dst)
        cmd += ["-C", str(src.parent), f"--transform=s,^{src.name},opt/pinned/{src.name},",
                src.name]
    env_path = f"{os.path.dirname(facts['exe'])}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    ld = ":".join(p for p in ["/usr/local/nvidia/lib64", *os.environ.get(
        "LD_LIBRARY_PATH", "").split(":")] if p and not p.startswith(("/usr/local/cuda", "/tmp")))
    changes = [f"ENV PATH={env_path}", f"ENV LD_LIBRARY_PATH={ld}", "ENV HOME=/root",
               f"ENV PYTHONPATH={':'.join(pinned)}", "WORKDIR /root"]
    changes += [f"ENV {k}={os.environ[k]}" for k in PASS_ENV if k in os.environ]
    log(f"tar members {members}; pinned {pinned}; excluded {len(excludes)} patterns"
        f"{' (full: no package left out)' if args.full else ''}")
    t0 = time.monotonic()
    client = docker.from_env(timeout=args.timeout)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None

    class Counting:
        n = 0

        def read(self, size: int = -1) -> bytes:
            data = proc.stdout.read(1 << 20 if size < 0 else size)  # type: ignore[union-attr]
            self.n += len(data)
            return data

    stream = Counting()
    result = client.api.import_image(src=stream, repository=args.tag.split(":")[0],
                                     tag=(args.tag.split(":") + ["latest"])[1], changes=changes)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    code = proc.wait()
    # GNU tar exits 1 for "file changed as we read it": harmless for a frozen stack.
    if code not in (0, 1):
        log(f"FAIL: tar exited {code}: {err.strip()[-2000:]}")
        return 1
    image = client.images.get(args.tag)
    log(f"built {args.tag} {image.short_id} from {stream.n / 1e9:.2f} GB of tar in "
        f"{time.monotonic() - t0:.0f} s; image size {image.attrs.get('Size', 0) / 1e9:.2f} GB"
        f" ({str(result).strip()[:120]})")
    return 0


CHECK_CUDA = r"""
import json, os, sys, time
t = time.time()
d = {"python": sys.version.split()[0], "exe": sys.executable}
import torch
d["torch"] = torch.__version__
d["cuda_available"] = torch.cuda.is_available()
d["device_count"] = torch.cuda.device_count()
if d["cuda_available"]:
    d["device"] = torch.cuda.get_device_name(0)
    x = torch.ones(1024, device="cuda")
    d["sum_on_gpu"] = float(x.sum())
if sys.argv[1] == "cuda":
    import vllm, vllm._C_stable_libtorch
    d["vllm"] = vllm.__version__
    d["vllm_file"] = vllm.__file__
    d["rms_norm_op"] = str(torch.ops._C.rms_norm)
d["seconds"] = round(time.time() - t, 1)
print(json.dumps(d))
"""


def check(args: argparse.Namespace) -> int:
    import docker

    from bisect_tool.runtime import gpu_passthrough as gp

    client = docker.from_env(timeout=args.timeout)
    kwargs: dict = {}
    if args.check != "none":
        access = gp.resolve(gp.GpuMode.DEVICES)
        kwargs = access.create_kwargs(args.gpu)
        image_env = dict(e.split("=", 1) for e in client.images.get(args.tag).attrs["Config"]["Env"])
        kwargs["environment"] = access.environment(image_env, {})
        log(f"devices {kwargs['devices']}")
        log(f"driver mounts {[m['Target'] for m in kwargs['mounts']]}")
    script = CHECK_CUDA if args.check != "none" else "import sys, json; print(json.dumps({'python': sys.version.split()[0], 'path': sys.path}))"
    t0 = time.monotonic()
    container = client.containers.create(
        args.tag, entrypoint=["python3"], command=["-c", script, args.check],
        network_mode="host", labels={"bisect.tool": "bisect", "bisect.role": "image-check"},
        detach=True, **kwargs,
    )
    try:
        container.start()
        code = container.wait(timeout=args.timeout)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    log(f"check {args.check}: exit {code} in {time.monotonic() - t0:.0f} s")
    if code != 0:
        log("FAIL: stderr tail:\n" + "\n".join(err.strip().splitlines()[-25:]))
        return 1
    facts = json.loads(out.strip().splitlines()[-1])
    facts["container_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(facts, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(facts, indent=1) + "\n")
    if args.check != "none" and not facts.get("cuda_available"):
        log("FAIL: torch.cuda.is_available() is False inside the container")
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--tag", required=True)
    b.add_argument("--python", default="python3")
    b.add_argument("--pinned", action="append", default=[])
    b.add_argument("--root", default="/")
    b.add_argument("--full", action="store_true")
    b.add_argument("--system", default="",
                   help="comma list of paths under --root instead of the system set (tests)")
    b.add_argument("--timeout", type=int, default=600)
    c = sub.add_parser("check")
    c.add_argument("--tag", required=True)
    c.add_argument("--check", choices=["cuda", "none"], default="cuda")
    c.add_argument("--gpu", default=None)
    c.add_argument("--json", default=None)
    c.add_argument("--timeout", type=int, default=240)
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else check(args)


if __name__ == "__main__":
    sys.exit(main())

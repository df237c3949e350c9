"""What this machine must have for a recipe's run, asked before anything is written.

One ``Check`` a line: the pinned interpreter, torch, the pinned stack, the GPU, Docker or Ray
when the recipe's backend needs them, the random checkpoint, the build command; ok, or missing
with the fix. ``needs`` says from the recipe alone which ones the run cannot do without
(``required``); `bisect plan` prints them all, and `bisect start` calls ``require`` before it
writes a journal, so a start that cannot work here is one line naming the fix and leaves no
session behind to refuse the next one (issue 31: a `--releases` run wrote its journal, then
failed for lack of torch).

Fast by design: modules are found (``importlib.util.find_spec``), never imported (torch alone
takes seconds), and each outside program is asked once.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool.errors import InfrastructureError
from bisect_tool.kinds import find
from bisect_tool.recipes.recipe import Recipe


@dataclass(frozen=True)
class Check:
    """One line of the environment: ``ok``, or missing with the ``fix``. ``required``: the run
    cannot work without it, so `start` refuses before it writes a journal."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = False

    def line(self) -> str:
        state = "ok" if self.ok else ("missing" if self.required else "missing (optional)")
        text = f"{self.name:<13}{state}: {self.detail}"
        return text if self.ok or not self.fix else f"{text}; fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Needs:
    """What a recipe's run needs of this machine (from the recipe alone)."""

    interpreter: bool  # the pinned interpreter runs the probe here (local backend)
    torch: bool  # a vLLM server, or an op check through torch
    gpu: bool  # the same: vLLM's kernels need a GPU
    pinned_package: bool  # a server is booted from the pinned package
    docker: bool  # the backend is docker
    ray: bool  # the backend is ray
    random_weights: bool  # [runtime] weights = "random:..." (made here, by this interpreter)


def needs(recipe: Recipe) -> Needs:
    probe, runtime = recipe.probe, recipe.runtime
    kind = find(probe.kind)
    kinds = [kind, *([find(probe.narrow)] if probe.narrow else [])]
    server = kind.boots_server
    settings = dataclasses.asdict(probe)
    op_torch = any(k.needs_torch(settings) for k in kinds)
    vllm_server = server and runtime.server_module.startswith("vllm")
    local = runtime.backend == "local"
    return Needs(
        interpreter=local and kind.local_interpreter,
        torch=(vllm_server or op_torch) and runtime.backend != "docker",
        gpu=(vllm_server or op_torch) and runtime.backend != "ray",
        pinned_package=local and server and bool(runtime.server_module),
        docker=runtime.backend == "docker",
        ray=runtime.backend == "ray",
        random_weights=server and runtime.weights.startswith("random:"),
    )


_ASK = r"""
import importlib.metadata as md, importlib.util, json, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable}
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    if spec is None:
        continue
    where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
    try:
        version = md.version(name)
    except Exception:
        version = ""
    out[name] = {"origin": where, "version": version}
print(json.dumps(out))
"""


def _ask(python: str, modules: Sequence[str], pythonpath: str = "",
         env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """What ``python`` finds of ``modules`` (found, not imported: torch takes seconds to load);
    None when the interpreter does not run. Asked the way the runtime asks it
    (``LocalBackend._find_package_dir``): from ``NEUTRAL_CWD``, with the recipe's ``[runtime]
    env``, so a clone in the caller's folder is not what it finds."""
    from bisect_tool.runtime.common import NEUTRAL_CWD

    child_env = {**os.environ, **(env or {})}
    if pythonpath:
        rest = child_env.get("PYTHONPATH", "")
        child_env["PYTHONPATH"] = pythonpath + (os.pathsep + rest if rest else "")
    try:
        done = subprocess.run(
            [python, "-c", _ASK, *modules], capture_output=True, text=True, timeout=60,
            env=child_env, cwd=NEUTRAL_CWD,
        )
        found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return found


def _gpus() -> list[str] | None:
    """The NVIDIA GPUs nvidia-smi lists; None when there is no nvidia-smi."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _docker(image: str) -> list[Check]:
    try:
        import docker

        client = docker.from_env(timeout=10)
        version = client.version().get("Version", "?")
    except Exception as exc:  # docker raises several unrelated types here
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return [Check("docker", False, f"the engine is not reachable ({first})",
                      "start it (make docker-up says what it changes first)", True)]
    checks = [Check("docker", True, f"engine {version}", required=True)]
    if image:
        try:
            client.images.get(image)
            checks.append(Check("image", True, image, required=True))
        except Exception:
            checks.append(Check("image", False, f"{image} is not on this engine",
                                f"docker pull/load {image}, or set [runtime] image", True))
    return checks


def _weights(recipe: Recipe) -> Check:
    """``random:CONFIG``: made once by this interpreter (torch + transformers), then cached."""
    import hashlib

    from bisect_tool.dirs import default_cache_dir
    from bisect_tool.recipes.recipe import BUNDLED_DIR

    spec = Path(recipe.runtime.weights.split(":", 1)[1]).expanduser()
    bases = [Path(recipe.source).parent] if recipe.source else []
    tried = [spec] if spec.is_absolute() else [b / spec for b in [*bases, BUNDLED_DIR]]
    config = next((c for c in tried if c.exists()), None)
    if config is None:
        return Check("weights", False, f"no config at {', '.join(map(str, tried))}",
                     "point [runtime] weights = 'random:...' at a config.json or its folder", True)
    config_file = config / "config.json" if config.is_dir() else config
    digest = hashlib.sha256(config_file.read_bytes()).hexdigest()[:16]
    out = default_cache_dir(recipe.artifacts.cache_dir) / "models" / f"random-{digest}"
    if (out / "config.json").exists():
        return Check("weights", True, f"random checkpoint cached at {out}", required=True)
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return Check(
            "weights", False,
            f"the random checkpoint from {config_file} is made by {sys.executable}, which lacks "
            f"{' and '.join(missing)}",
            f"pip install {' '.join(missing)} there, or set [runtime] weights to a checkpoint "
            "folder", True,
        )
    return Check("weights", True, f"a random checkpoint will be made once from {config_file}",
                 required=True)


def environment(recipe: Recipe | None) -> list[Check]:
    """The environment lines for ``recipe`` (none for a --run or manual bisect)."""
    if recipe is None:
        return []
    need = needs(recipe)
    runtime = recipe.runtime
    checks: list[Check] = []
    if need.interpreter:
        checks.extend(_interpreter(recipe, need))
    if need.torch or need.gpu:
        checks.append(_gpu(need))
    if need.docker:
        checks.extend(_docker(runtime.image))
    if need.ray:
        checks.append(_ray(recipe))
    if need.random_weights:
        checks.append(_weights(recipe))
    checks.extend(_build(recipe, need))
    return checks


def _interpreter(recipe: Recipe, need: Needs) -> list[Check]:
    """The pinned interpreter, its torch and the pinned package in it."""
    runtime = recipe.runtime
    python = runtime.interpreter()
    package = recipe.artifacts.package
    found = _ask(python, ["torch", package], runtime.pinned_package_dir, runtime.env)
    if found is None:
        return [Check("interpreter", False, f"{python} does not run",
                      "set [runtime] python (--python) to the pinned interpreter", True)]
    checks = [Check("interpreter", True, f"{found['executable']} (Python {found['python']})",
                    required=True)]
    torch = found.get("torch")
    if torch and "origin" in torch:
        checks.append(Check("torch", True, f"torch {torch['version'] or '?'}",
                            required=need.torch))
    elif need.torch:
        checks.append(Check(
            "torch", False, f"{found['executable']} has no torch",
            f"install the torch the pinned {package} needs into it, or set [runtime] "
            "python (--python)", True))
    pkg = found.get(package)
    if need.pinned_package:
        where = runtime.pinned_package_dir or "its site-packages"
        if pkg and "origin" in pkg:
            version = f" {pkg['version']}" if pkg["version"] else ""
            checks.append(Check("pinned stack", True,
                                f"{package}{version} at {Path(pkg['origin']).parent}",
                                required=True))
        else:
            checks.append(Check(
                "pinned stack", False, f"{package} is not importable from {where}",
                f"install {package} into {found['executable']}, or point [runtime] "
                "pinned_package_dir (--pinned-dir) at the folder holding it", True))
    return checks


def _gpu(need: Needs) -> Check:
    gpus = _gpus()
    if gpus:
        return Check("gpu", True, f"{len(gpus)} x {gpus[0]}", required=need.gpu)
    why = "nvidia-smi not found" if gpus is None else "nvidia-smi lists none"
    return Check("gpu", False, f"no NVIDIA GPU ({why})",
                 "run on a machine with an NVIDIA GPU and its driver", need.gpu)


def _ray(recipe: Recipe) -> Check:
    if importlib.util.find_spec("ray") is None:
        from bisect_tool.evaluate.ray import INSTALL_HINT

        return Check("ray", False, "ray is not installed here", INSTALL_HINT, True)
    return Check("ray", True, recipe.runtime.ray_address or "a local cluster", required=True)


def _build(recipe: Recipe, need: Needs) -> list[Check]:
    """What a source build needs where it runs (not required: other sources may serve)."""
    settings = recipe.artifacts
    if "source-build" not in settings.sources or not settings.build_command:
        return []
    if settings.build_executor == "docker" and not need.docker:
        return [dataclasses.replace(c, required=False) for c in _docker("")]
    if settings.build_executor != "host":
        return []
    import shlex

    try:
        program = shlex.split(settings.build_command)[0]
    except (ValueError, IndexError):
        program = settings.build_command
    found_at = shutil.which(program)
    return [Check(
        "build", bool(found_at),
        f"host builds run `{settings.build_command}`"
        + (f" ({program}: {found_at})" if found_at else f"; {program} is not on PATH"),
        f"install {program} or fix [artifacts] build_command",
    )]


def require(recipe: Recipe | None) -> list[Check]:
    """`start`'s check before it writes a journal: the first required line that is missing is
    an ``InfrastructureError`` naming its fix; else the lines, for the caller to show."""
    checks = environment(recipe)
    for check in checks:
        if check.required and not check.ok:
            raise InfrastructureError(
                f"{check.name}: {check.detail}; fix: {check.fix} (`bisect plan` checks it all "
                "without starting)"
            )
    return checks

"""Which CUDA variant of vLLM's per-commit wheels the pinned stack can load.

vLLM's setup.py (``precompiled_wheel_utils.detect_system_cuda_variant``) picks the variant from
``torch.version.cuda``, else the CUDA version nvidia-smi reports, else the default; it maps the
major version, ``{12: "cu129", 13: "cu130"}``. The swapped files load into the *pinned* stack, so
its torch is asked: the interpreter the runtime runs (``[runtime] python``, with the pinned
package dir on its path), or the image's ``python3`` for the docker backend; never the tool's
own, which may have no torch at all.

The default folder's build changed CUDA: cu129 until vLLM PR #39878 (opened 2026-04-15, in
v0.20.0) made cu130 the default and cu129 a variant (vllm-facts.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: vLLM setup.py's map from torch's CUDA major version to the wheel variant
VARIANTS = {12: "cu129", 13: "cu130"}
#: vLLM PR #39878: before it the unsuffixed default build was CUDA 12.9, after it CUDA 13.0. The
#: PR was opened on 2026-04-15 and shipped in v0.20.0 (late April 2026); a commit from between
#: is judged by this date, and the choice says it was judged by date.
DEFAULT_SWITCH = datetime(2026, 4, 15, tzinfo=UTC).timestamp()
DEFAULT_BEFORE, DEFAULT_AFTER = "cu129", "cu130"

_SCRIPT = "import json, torch; print(json.dumps(torch.version.cuda))"
_CU = re.compile(r"^cu(\d+)(\d)$")


def variant_major(variant: str) -> int | None:
    """The CUDA major version of a variant name: ``cu129`` -> 12, ``cu130`` -> 13; None for
    ``cpu`` or anything else."""
    match = _CU.match(variant or "")
    return int(match.group(1)) if match else None


def variant_of_version(version: str) -> str:
    """``13.0`` -> ``cu130``: vLLM's variant for a CUDA version (its major, as setup.py maps
    it; an unmapped major keeps its own digits, ``cu{major}{minor}``)."""
    try:
        major, _, minor = version.partition(".")
        return VARIANTS.get(int(major), f"cu{int(major)}{(minor or '0')[:1]}")
    except ValueError:
        return ""


@dataclass(frozen=True)
class PinnedCuda:
    """The CUDA the pinned stack's torch is built for, and how that was learned."""

    version: str  # "13.0"; "" when nothing said
    how: str  # "torch.version.cuda of /usr/bin/python3", "nvidia-smi", "not known: ..."

    @property
    def major(self) -> int | None:
        try:
            return int(self.version.split(".")[0])
        except ValueError:
            return None

    @property
    def variant(self) -> str:
        """The wheel variant setup.py would pick ("" when the CUDA is not known)."""
        return variant_of_version(self.version) if self.version else ""

    def loads(self, variant: str) -> bool | None:
        """Whether a build of ``variant`` loads under this torch (its CUDA major matches);
        None when either side is not known."""
        if self.major is None:
            return None
        if variant == "cpu":
            return False
        wheel = variant_major(variant)
        return None if wheel is None else wheel == self.major

    def refusal(self, variant: str, whose: str = "wheel") -> str:
        """"cu129 wheel; the pinned torch is built for CUDA 13.0" """
        return f"{variant} {whose}; the pinned torch is built for CUDA {self.version} " \
            f"({self.how})"


UNKNOWN = PinnedCuda("", "not known")


def _ask_interpreter(runtime: Any) -> PinnedCuda | None:
    interpreter = runtime.interpreter()
    env = dict(os.environ)
    if runtime.pinned_package_dir:
        rest = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = runtime.pinned_package_dir + (os.pathsep + rest if rest else "")
    try:
        done = subprocess.run(
            [interpreter, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    try:
        version = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return PinnedCuda(str(version or ""), f"torch.version.cuda of {interpreter}")


def _ask_image(runtime: Any, docker_client: Any) -> PinnedCuda | None:
    """``torch.version.cuda`` in the pinned image (no GPU needed to read it)."""
    try:
        import docker

        client = docker_client or docker.from_env()
        out = client.containers.run(
            runtime.image, command=["-c", _SCRIPT], entrypoint=[runtime.interpreter()],
            remove=True, stdout=True, stderr=False, network_mode="none",
        )
        version = json.loads(bytes(out).decode().strip().splitlines()[-1])
    except Exception:  # no engine, no image, no torch: the next way is tried
        return None
    return PinnedCuda(str(version or ""), f"torch.version.cuda in {runtime.image}")


def _ask_nvidia_smi() -> PinnedCuda | None:
    try:
        done = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"CUDA Version:\s*(\d+\.\d+)", done.stdout)
    return PinnedCuda(match.group(1), "nvidia-smi (no torch in the pinned stack)") \
        if match else None


def ask_pinned_cuda(runtime: Any, *, docker_client: Any = None) -> PinnedCuda:
    """What setup.py would detect, asked of the pinned stack (``runtime``: the recipe's
    ``RuntimeSettings``): its torch, else nvidia-smi, else ``UNKNOWN`` (the default folder is
    then used unchecked, as setup.py does)."""
    if runtime is not None:
        asked = (_ask_image(runtime, docker_client) if runtime.backend == "docker"
                 else _ask_interpreter(runtime))
        if asked is not None and asked.version:
            return asked
    return _ask_nvidia_smi() or UNKNOWN

"""What the report's environment block shows, asked of the pinned stack the lifetimes run."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

from bisect_tool import __version__

_ENV_SCRIPT = r"""
import json, platform, sys
facts = {"python": platform.python_version()}
try:
    import importlib.metadata as md
    facts["pinned_version"] = md.version(sys.argv[1])
except Exception:
    pass
try:
    import torch
    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda or ""
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        facts["compute_capability"] = f"{major}.{minor}"
except Exception:
    pass
try:
    import triton
    facts["triton"] = triton.__version__
except Exception:
    pass
# what a maintainer compares with the reported setup: the sampler and model libraries, and the
# compiled files of the pinned package that its install lacks (a stack carried without them)
import importlib.metadata as md
for dist, key in (("flashinfer-python", "flashinfer"), ("flashinfer", "flashinfer"),
                  ("transformers", "transformers"), ("xgrammar", "xgrammar")):
    try:
        facts.setdefault(key, md.version(dist))
    except Exception:
        pass
# Against the wheel's own file list (its RECORD, which pip installs as it is): a RECORD that is
# missing, or lists no compiled file, is no such list, and the check says it did not run
# (issue 41: "Missing compiled files: none" where five extensions were absent and no RECORD was).
def compiled(name):
    return name.endswith((".so", ".pyd")) or ".so." in name
try:
    dist = md.distribution(sys.argv[1])
    record = dist.files
    listed = [f for f in record or [] if compiled(str(f))]
    if record is None:
        facts["compiled_files"] = {"not_checked": "the pinned install has no RECORD, the "
                                   "wheel's file list"}
    elif not listed:
        facts["compiled_files"] = {"not_checked": "the pinned install's RECORD lists no "
                                   "compiled file, so it is not the wheel's file list"}
    else:
        missing = sorted(str(f) for f in listed if not f.locate().exists())
        facts["compiled_files"] = {"against": f"the RECORD of {dist.metadata['Name']} "
                                   f"{dist.version}", "listed": len(listed), "missing": missing}
        facts["missing_extensions"] = missing
except md.PackageNotFoundError:
    facts["compiled_files"] = {"not_checked": f"no installed distribution of {sys.argv[1]}"}
except Exception as exc:
    facts["compiled_files"] = {"not_checked": f"{type(exc).__name__}: {exc}"}
print(json.dumps(facts))
"""


def environment_facts(recipe: Any) -> dict[str, Any]:
    """What the report's Environment line shows: the pinned stack's Python, torch, GPU, driver.

    Asked of the pinned stack's interpreter (local backend) so the versions are the ones the
    lifetimes ran with; best effort, never an error. ``interpreter`` names that interpreter and
    ``python`` carries its path too, so the report says which one ran (the tool's own unless
    the recipe or --python named another).
    """
    runtime = recipe.runtime
    facts: dict[str, Any] = {"tool": __version__, "host_python": platform.python_version()}
    facts["backend"] = runtime.backend
    if runtime.backend == "docker":
        facts["image"] = runtime.image
    else:
        from bisect_tool.runtime.common import NEUTRAL_CWD

        # asked as the runtime asks (not from the caller's folder: a clone there would be what
        # it finds) and with the lifetimes' own [runtime] env
        env = {**os.environ, **runtime.env}
        if runtime.pinned_package_dir:
            rest = env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = runtime.pinned_package_dir + (os.pathsep + rest if rest else "")
        interpreter = runtime.interpreter()
        facts["interpreter"] = interpreter
        try:
            done = subprocess.run(
                [interpreter, "-c", _ENV_SCRIPT, recipe.artifacts.package],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
                cwd=NEUTRAL_CWD,
            )
            facts.update(json.loads(done.stdout.strip().splitlines()[-1]))
            whose = "the tool's own, " if interpreter == sys.executable else ""
            facts["python"] = f"{facts['python']} ({whose}{interpreter})"
        except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError):
            facts["python"] = f"unknown ({interpreter} did not answer)"
        if runtime.pinned_package_dir:
            facts["pinned_stack"] = runtime.pinned_package_dir
    facts.update(_weights_facts(recipe))
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if smi.returncode == 0 and smi.stdout.strip():
            name, _, driver = smi.stdout.strip().splitlines()[0].partition(",")
            facts.setdefault("gpu", name.strip())
            facts["driver"] = driver.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return facts


def _weights_facts(recipe: Any) -> dict[str, Any]:
    """How the random checkpoint the lifetimes load was made (its seed, dtype, torch and
    transformers; ``runtime.cli.WEIGHTS_RECORD``), so the report can say how to make it again.
    The checkpoint exists by now: the evaluators made it before the first lifetime."""
    from pathlib import Path

    from bisect_tool.errors import BisectError
    from bisect_tool.runtime.cli import WEIGHTS_RECORD, weight_digests
    from bisect_tool.runtime.weights import resolve_weights

    if not str(recipe.runtime.weights).startswith("random:"):
        return {}
    try:
        model = Path(resolve_weights(recipe).runtime.model)
        record = json.loads((model / WEIGHTS_RECORD).read_text(encoding="utf-8"))
        if isinstance(record, dict) and "files" not in record:
            # a checkpoint made before its record held its digests: hashed here, once a run
            record["files"] = weight_digests(model)
    except (OSError, ValueError, BisectError):
        return {}
    return {"weights": record} if isinstance(record, dict) else {}

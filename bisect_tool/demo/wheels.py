"""The demo history's per-commit wheel index, as vLLM's CI would have published it (vllm-facts.md,
"Where per-commit builds come from"), served on loopback by ``artifacts.wheelhost.WheelHost``:

- a wheel for each commit of ``main`` (none for a release branch's commits, vLLM #16217) whose
  build succeeds (a commit that does not build has nothing: CI published nothing for it);
- the default folder holds the build for the CUDA its own ``.buildkite/release-pipeline.yaml``
  names (12.9 before the history's switch, 13.0 from it: vLLM #39878), and the other CUDA is a
  variant folder: except that before the switch only most commits had a ``cu130`` build ("Not
  every variant exists for every commit"): one in ``NO_CU130_EVERY`` has only ``cu129``;
- the wheels are built on first request: the commit's sources (``git archive``), its own
  ``setup.py``, zipped with its ``demollm`` package. A variant wheel holds the same build (the
  demo's C kernel has no CUDA); its name and folder are what differ.

The demo's pinned stack stands for one built against CUDA 13.0 (``[artifacts] variant =
"cu130"`` in the recipe ``bisect demo`` writes), so a commit before the switch is read from its
``cu130`` folder, and one without that build goes to the next source, a source build.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

from bisect_tool.artifacts.wheelhost import HostedCommit, WheelHost, write_wheel
from bisect_tool.demo.history import PIPELINE, DemoHistory, default_cuda
from bisect_tool.demo.pinned import SWAP_PATH, run_build
from bisect_tool.errors import BuildFailed, InfrastructureError

PACKAGE = "demollm"
#: before the switch, the cu130 build of one commit in this many (by its SHA) is missing
NO_CU130_EVERY = 7


def _variant(cuda: str) -> str:
    return "cu" + cuda.replace(".", "")[:3]


def hosted_commits(history: DemoHistory) -> list[HostedCommit]:
    """What the index holds, commit by commit: main's commits that build, each with its
    default variant and the variant folders it has."""
    broken = set(history.broken_commits)
    # the commits that changed the pipeline, and what each says: one git call for the history
    changed = _git(history.repo, "log", "--first-parent", "--format=%H", "main", "--",
                   PIPELINE).split()
    says = {c: _variant(default_cuda(_git(history.repo, "show", f"{c}:{PIPELINE}")) or "12.9")
            for c in changed}
    out = []
    default = "cu129"
    for commit in history.main_commits:
        default = says.get(commit, default)
        if commit in broken:
            continue
        variants: tuple[str, ...] = ("cu129", "cu130")
        if default == "cu129" and int(commit, 16) % NO_CU130_EVERY == 0:
            variants = ("cu129",)
        out.append(HostedCommit(commit, default=default, variants=variants,
                                arches=("x86_64",)))
    return out


def demo_host(history: DemoHistory, work: Path) -> WheelHost:
    """The index for ``history`` (not started: use it as a context manager); wheels are built
    under ``work``."""
    work.mkdir(parents=True, exist_ok=True)

    def build(commit: str, variant: str) -> Path:
        out = work / f"{commit[:12]}-{variant or 'legacy'}.whl"
        if out.is_file():
            return out
        with tempfile.TemporaryDirectory(prefix="demo-wheel-", dir=work) as tmp:
            root = Path(tmp)
            archive = subprocess.run(["git", "-C", str(history.repo), "archive", "--format=tar",
                                      commit], capture_output=True, check=False)
            if archive.returncode != 0:
                raise InfrastructureError(f"git archive {commit[:12]} failed: "
                                          f"{archive.stderr.decode().strip()}")
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(root, filter="data")
            try:
                so = run_build(root)
            except BuildFailed as exc:  # hosted_commits leaves out what does not build
                raise InfrastructureError(f"the demo wheel of {commit[:12]}: {exc}") from None
            members = {f"{PACKAGE}/{p.name}": p.read_bytes()
                       for p in sorted((root / PACKAGE).glob("*.py"))}
            members[SWAP_PATH] = so.read_bytes()
            hosted = host.commits[commit]
            name = host.filename(hosted, None if variant == hosted.default else variant)
            version = name.split("-")[1]
            return write_wheel(out, members, name=PACKAGE, version=version,
                               tag="cp38-abi3-" + f"{hosted.platform}_x86_64")

    host = WheelHost(build, package=PACKAGE)
    host.add(*hosted_commits(history))
    return host


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=False)
    return done.stdout if done.returncode == 0 else ""

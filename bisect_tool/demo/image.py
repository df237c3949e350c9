"""The demo's pinned image: bisect-base:bookworm plus the demollm stack (`--backend docker`).

The Docker backend needs the pinned stack *inside* an image (it mounts each candidate's
``_kernels.so`` over the pinned one at the path the image reports). No registry is reachable
here, so the image is derived locally from the offline base image that scripts/docker-up.sh
makes, with the stack's sources copied to ``/opt/demo-stack`` and its pinned extension compiled
there by the image's own compiler. It is tagged by a digest of what goes in, so it is built once
and rebuilt only when the stack or this recipe changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bisect_tool.demo.pinned import STACK_DIR
from bisect_tool.errors import InfrastructureError
from bisect_tool.labels import LABEL_IMAGE

BASE_IMAGE = "bisect-base:bookworm"
IMAGE_REPO = "bisect-demo-stack"
STACK_IN_IMAGE = "/opt/demo-stack"
# Not bisect.tool: containers inherit image labels, and that label marks what cleanup removes.
IMAGE_LABEL = "bisect.demo-stack"

# Build outputs and local state of the host's copy of the stack: never copied in (the image
# compiles its own pinned extension) and never part of the tag.
_SKIP_NAMES = {"__pycache__", ".build.lock", "build"}
_SKIP_SUFFIXES = (".so", ".source-sha256", ".pyc", ".o", ".tmp")

DOCKERFILE = f"""\
FROM {{base}}
# numpy is demollm's one dependency beyond the stdlib. Base images made before docker-up.sh
# listed python3-numpy lack it; then it comes from the Debian mirror the image is set up with
# (the build uses host networking: the engine runs with --bridge=none).
RUN python3 -c "import numpy" 2>/dev/null || ( \\
    apt-get update -qq \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
       python3-numpy \\
    && rm -rf /var/lib/apt/lists/* )
COPY stack {STACK_IN_IMAGE}
# The pinned extension is compiled here, by the image's compiler, with the same command a
# candidate is built with (bisect_tool.demo.pinned.BUILD_COMMAND).
RUN cd {STACK_IN_IMAGE} && python3 setup.py build_ext --inplace \\
    && PYTHONPATH={STACK_IN_IMAGE} python3 -c "import demollm.server"
ENV PYTHONPATH={STACK_IN_IMAGE}
"""

Progress = Callable[[str], None]


def _stack_files(stack_dir: Path) -> list[Path]:
    files = []
    for path in sorted(stack_dir.rglob("*")):
        rel = path.relative_to(stack_dir)
        if any(part in _SKIP_NAMES for part in rel.parts) or path.name.endswith(_SKIP_SUFFIXES):
            continue
        if path.is_file():
            files.append(path)
    return files


def image_tag(stack_dir: Path = STACK_DIR, base: str = BASE_IMAGE) -> str:
    """``bisect-demo-stack:<digest>`` over the stack's sources and the Dockerfile."""
    digest = hashlib.sha256(DOCKERFILE.format(base=base).encode() + b"\0")
    for path in _stack_files(stack_dir):
        digest.update(path.relative_to(stack_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return f"{IMAGE_REPO}:{digest.hexdigest()[:16]}"


@contextlib.contextmanager
def docker_client() -> Iterator[Any]:
    """A client of the running engine, closed on exit; a down engine is an InfrastructureError."""
    import docker
    import docker.errors
    import requests

    try:
        client = docker.from_env()
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InfrastructureError(
            f"Docker engine: {first}; start it with make docker-up or use --backend local"
        ) from None
    try:
        yield client
    finally:
        client.close()


def ensure_image(
    client: Any,
    *,
    stack_dir: Path = STACK_DIR,
    base: str = BASE_IMAGE,
    progress: Progress | None = None,
) -> str:
    """The tag of the demo image, built from ``base`` first if it is not there yet."""
    import docker.errors
    import requests

    tag = image_tag(stack_dir, base)
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    except (docker.errors.APIError, requests.RequestException) as exc:
        raise InfrastructureError(f"Docker engine: {exc}") from None
    try:
        client.images.get(base)
    except docker.errors.ImageNotFound:
        raise InfrastructureError(
            f"base image {base} missing; build it with make docker-up"
        ) from None
    if progress is not None:
        progress(f"building the demo image {tag} from {base} (once; cached by tag)")
    with tempfile.TemporaryDirectory(prefix="bisect-demo-image-") as tmp:
        ctx = Path(tmp)
        for path in _stack_files(stack_dir):
            dest = ctx / "stack" / path.relative_to(stack_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        (ctx / "Dockerfile").write_text(DOCKERFILE.format(base=base))
        try:
            client.images.build(
                path=str(ctx),
                tag=tag,
                network_mode="host",
                rm=True,
                forcerm=True,
                labels={IMAGE_LABEL: tag.partition(":")[2], LABEL_IMAGE: IMAGE_REPO},
            )
        except docker.errors.BuildError as exc:
            last = [str(c.get("stream", "")).strip() for c in exc.build_log if c.get("stream")]
            why = last[-1] if last else str(exc)
            raise InfrastructureError(
                f"building {tag} failed ({why}); if numpy could not be installed, rebuild the "
                f"base image with python3-numpy (docker rmi {base}; make docker-up)"
            ) from None
        except (docker.errors.APIError, requests.RequestException) as exc:
            raise InfrastructureError(f"Docker engine while building {tag}: {exc}") from None
    return tag

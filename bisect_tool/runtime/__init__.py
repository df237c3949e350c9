"""Runtime stage: boots one *lifetime* (a fresh server of the pinned stack with a candidate's swap
set in place), checks a candidate's op schemas against the pinned stack's, and leases GPUs.

``make_backend`` picks the backend the recipe names: ``local`` (a child process group, runs
anywhere incl. the lent GPU machine without Docker) or ``docker`` (a container of the pinned
image per lifetime); ``ray`` schedules each lifetime as a Ray task that runs the local backend
on a cluster node (``bisect_tool.evaluate.ray``, chosen in ``bisect_tool.run.wiring``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bisect_tool.errors import RecipeError
from bisect_tool.interfaces import RuntimeBackend
from bisect_tool.recipes.recipe import RuntimeSettings
from bisect_tool.runtime.common import RunningServer, sigterm_raises
from bisect_tool.runtime.gpus import GpuPool
from bisect_tool.runtime.local import LocalBackend
from bisect_tool.runtime.schemas import compare_schemas

if TYPE_CHECKING:
    from bisect_tool.runtime.docker_backend import DockerBackend

__all__ = [
    "DockerBackend",
    "GpuPool",
    "LocalBackend",
    "RunningServer",
    "compare_schemas",
    "make_backend",
    "sigterm_raises",
]


def make_backend(
    settings: RuntimeSettings,
    *,
    session: str,
    log_dir: Path,
    docker_client: Any = None,
    http_client: httpx.Client | None = None,
) -> RuntimeBackend:
    """The backend ``settings.backend`` names (its users see ``interfaces.RuntimeBackend``
    alone); a Docker engine that is down is an ``InfrastructureError`` naming
    `make docker-up`."""
    if settings.backend in ("local", "ray"):
        # ray: every node runs the local backend inside a Ray task
        # (bisect_tool.evaluate.ray); on this host it finds and removes leftovers.
        return LocalBackend(settings, session=session, log_dir=log_dir, http_client=http_client)
    if settings.backend == "docker":
        from bisect_tool.runtime.docker_backend import DockerBackend

        return DockerBackend(
            settings,
            session=session,
            log_dir=log_dir,
            docker_client=docker_client,
            http_client=http_client,
        )
    raise RecipeError(
        f"unknown runtime backend '{settings.backend}'; "
        "[runtime] backend must be local, docker or ray"
    )


def __getattr__(name: str) -> Any:
    # The docker SDK is imported only when the docker backend is used.
    if name == "DockerBackend":
        from bisect_tool.runtime.docker_backend import DockerBackend

        return DockerBackend
    raise AttributeError(name)

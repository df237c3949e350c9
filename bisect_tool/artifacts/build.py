"""Source builds of a candidate's swap set, in a detached ``git worktree`` (never the user's
checkout; always removed), on the host or in a container of the Dockerfile.base builder stage.

A build the run no longer needs (a lookahead the search moved away from, or the run ending) is
stopped through its ``Ticket``: the process group (or container) is killed, the worktree and the
scratch folder are removed, and nothing reaches the cache, which only ever receives a build's
output after the build exited 0 (``CachingProvider._from``).

Docker: the builder stage is built once (``docker build --target builder`` with ARCH_LIST and
MAX_JOBS; Docker's layer cache makes later calls instant) and each candidate is built by a
container of that image with the worktree bind-mounted at /src and the cache's ccache folder at
/ccache, on the host network. A ``docker build`` with the worktree as context could not mount
the compiler cache (the classic builder has no cache mounts), so every candidate would rebuild
from zero; with the bind mount consecutive commits recompile only what changed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from bisect_tool.artifacts.sources import Fetched
from bisect_tool.errors import ArtifactUnavailable, BuildFailed, InfrastructureError
from bisect_tool.labels import LABEL_SESSION, LABEL_TOOL, TOOL_NAME
from bisect_tool.range.worktrees import WorktreeError, worktree
from bisect_tool.recipes.recipe import ArtifactSettings

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile.base"
LOG_TAIL_LINES = 25


class Cancelled(Exception):
    """The fetch was stopped: the run no longer wants it. Never a verdict on the candidate, so
    not an ``UntestableError``; only the provider sees it (a demand then fetches anew)."""


class Deferred(Cancelled):
    """A lookahead build the build budget does not allow now (builds <= runs + K)."""


class Ticket:
    """One fetch's permission to build and its stop switch.

    ``start_build`` is asked before a source build begins: it raises ``Cancelled`` once the fetch
    was cancelled, ``Deferred`` when ``permit`` (the provider's build budget) says no. ``cancel``
    runs the kill callbacks the running build registered (``killed_on_cancel``), from the
    cancelling thread: no watcher thread, no polling."""

    def __init__(self, permit: Callable[[], bool] | None = None) -> None:
        self._permit = permit
        self._lock = threading.Lock()
        self._cancelled = False
        self._kills: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        with self._lock:
            return self._cancelled

    def start_build(self) -> None:
        if self.cancelled:
            raise Cancelled("cancelled before it started")
        if self._permit is not None and not self._permit():
            raise Deferred("the build budget allows no lookahead build now")

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            kills = list(self._kills)
        for kill in kills:
            with contextlib.suppress(Exception):  # the build may have ended meanwhile
                kill()

    @contextmanager
    def killed_on_cancel(self, kill: Callable[[], None]) -> Iterator[None]:
        """While the block runs, ``cancel`` calls ``kill`` (at once if already cancelled)."""
        with self._lock:
            already = self._cancelled
            if not already:
                self._kills.append(kill)
        if already:
            kill()
        try:
            yield
        finally:
            with self._lock:
                if kill in self._kills:
                    self._kills.remove(kill)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@contextmanager
def _checkout(repo: Path, commit: str, scratch: Path) -> Iterator[Path]:
    try:
        with worktree(repo, commit, scratch) as src:
            yield src
    except WorktreeError as exc:
        raise ArtifactUnavailable(f"cannot check out {commit[:12]} in {repo}: {exc}") from None


def _copy_stream(chunks: Iterator[bytes], out: BinaryIO) -> None:
    # after a timeout the log file may close first; the build's verdict does not need the rest
    with contextlib.suppress(ValueError, OSError):
        for chunk in chunks:
            out.write(chunk)


@contextmanager
def _own_python(scratch: Path) -> Iterator[Path]:
    """A folder of ``python3``/``python`` shims that run the tool's own interpreter, for the
    front of a host build's PATH: a build command saying ``python3 setup.py ...`` must not get
    whatever ``python3`` comes first on the user's PATH (one without the build's packages made
    every candidate untestable). A recipe that wants another interpreter names it in its
    build_command. Scripts, not links: a venv's interpreter finds its venv by its own path."""
    import shlex
    import sys

    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="python-shims-", dir=scratch) as folder:
        for name in ("python3", "python"):
            shim = Path(folder) / name
            shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
            shim.chmod(0o755)
        yield Path(folder)


class SourceBuild:
    """The ``source-build`` source."""

    name = "source-build"

    def __init__(
        self,
        settings: ArtifactSettings,
        repo: Path,
        *,
        scratch: Path,
        ccache_dir: Path,
        log_dir: Path,
        docker_client: Any = None,
        progress: Callable[[str], None] | None = None,
        session: str = "",
    ) -> None:
        self.settings = settings
        self.session = session
        self.repo = repo
        self.scratch = scratch
        self.ccache_dir = ccache_dir
        self.log_dir = log_dir
        self._docker = docker_client
        self.progress = progress or (lambda _msg: None)

    def fetch(
        self, commit: str, tags: Sequence[str], work: Path, ticket: Ticket | None = None
    ) -> Fetched:
        """Build ``commit``'s swap set. ``ticket`` (the provider's): asked before the build
        starts; cancelling it kills the build (``Cancelled``), leaving nothing behind."""
        if not self.settings.build_command:
            raise ArtifactUnavailable("no build_command in the recipe's [artifacts]")
        if not (self.repo / ".git").exists():
            raise ArtifactUnavailable(f"{self.repo} is not a git clone; give --repo")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"build-{commit[:12]}.log"
        executor = self.settings.build_executor
        if executor not in ("host", "docker"):
            raise ArtifactUnavailable(
                f"unknown build_executor '{executor}'; use 'docker' or 'host'"
            )
        ticket = ticket or Ticket()
        ticket.start_build()
        with _checkout(self.repo, commit, self.scratch) as src:
            self.progress(f"building {commit[:12]} ({executor}); log: {log}")
            if executor == "host":
                code = self._host(src, log, ticket)
            else:
                code = self._container(src, log, ticket)
            if code != 0 and ticket.cancelled:
                with contextlib.suppress(OSError), log.open("a") as note:
                    note.write("\n[bisect] build cancelled: the run no longer needs it\n")
                raise Cancelled(f"build of {commit[:12]} cancelled")
            if code is None:
                raise BuildFailed(
                    f"build of {commit[:12]} still running after "
                    f"{self.settings.build_timeout_s} s, killed; log {log}, last lines:\n"
                    + log_tail(log)
                    + "\n(raise [artifacts] build_timeout_s if the build is just slow)"
                )
            if code != 0:
                raise BuildFailed(
                    f"build of {commit[:12]} failed (exit {code}); log {log}, last lines:\n"
                    + log_tail(log)
                )
            out = work / "built"
            for rel in self.settings.swap_set:
                built = src / rel
                if not built.is_file():
                    raise BuildFailed(
                        f"build of {commit[:12]} succeeded but did not produce {rel}; "
                        f"check build_command (log {log})"
                    )
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, out / rel)  # the worktree is removed on leaving this block
        return Fetched("dir", out, f"source-build:{executor}:{commit}")

    def _env(self) -> dict[str, str]:
        return {
            "ARCH_LIST": self.settings.arch_list,
            "TORCH_CUDA_ARCH_LIST": self.settings.arch_list,
            "MAX_JOBS": str(self.settings.max_jobs),
        }

    def _host(self, src: Path, log: Path, ticket: Ticket) -> int | None:
        """The build's exit status, or None when it ran past the timeout (then killed)."""
        env = {**os.environ, **self._env(), "CCACHE_DIR": str(self.ccache_dir)}
        if self.session:
            # labelled like the servers: after a kill -9 of bisect, `resume`/`reset` find the
            # build's process group by it and end it (children.end_labelled)
            env["BISECT_SESSION"] = self.session
        if Path("/usr/lib/ccache").is_dir():  # Debian's compiler wrappers: gcc goes via ccache
            env["PATH"] = "/usr/lib/ccache:" + env.get("PATH", "")
        with _own_python(self.scratch) as shims, log.open("wb") as out:
            env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
            # its own process group: on timeout make, ninja and every compiler go too
            process = subprocess.Popen(
                ["bash", "-c", self.settings.build_command],
                cwd=src,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            def kill() -> None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)

            try:
                with ticket.killed_on_cancel(kill):
                    return process.wait(timeout=self.settings.build_timeout_s)
            except subprocess.TimeoutExpired:
                return None
            finally:
                # the timed-out build, or what a finished one left running
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    # --- docker --------------------------------------------------------------------------
    def _client(self) -> Any:
        if self._docker is None:
            try:
                import docker

                client = docker.from_env()
                client.ping()
            except Exception as exc:  # docker raises several unrelated types here
                raise InfrastructureError(
                    f"Docker engine not reachable ({exc}); start it (scripts/docker-up.sh) "
                    "or set build_executor = 'host'"
                ) from None
            self._docker = client
        return self._docker

    def builder_image(self) -> str:
        """The image candidates are built in: settings.build_image, else Dockerfile.base's
        builder stage (built here; Docker's cache makes it a no-op after the first time)."""
        if self.settings.build_image:
            return self.settings.build_image
        if not DOCKERFILE.is_file():
            raise InfrastructureError(
                f"{DOCKERFILE} not found; set [artifacts] build_image to a builder image"
            )
        client = self._client()
        tag = "bisect-builder:latest"
        with tempfile.TemporaryDirectory(prefix="ctx-", dir=self.scratch) as context:
            try:
                client.images.build(
                    path=context,  # the builder stage copies nothing in: sources are mounted
                    dockerfile=str(DOCKERFILE),
                    target="builder",
                    tag=tag,
                    buildargs={
                        "ARCH_LIST": self.settings.arch_list,
                        "MAX_JOBS": str(self.settings.max_jobs),
                    },
                    network_mode="host",
                    rm=True,
                )
            except Exception as exc:
                raise InfrastructureError(
                    f"building the builder stage of {DOCKERFILE.name} failed: {exc}; "
                    "is the base image there (scripts/docker-up.sh)?"
                ) from None
        return tag

    def _container(self, src: Path, log: Path, ticket: Ticket) -> int | None:
        """The build's exit status, or None when it ran past the timeout (then killed)."""
        client = self._client()
        image = self.builder_image()
        self.ccache_dir.mkdir(parents=True, exist_ok=True)
        container = client.containers.create(
            image,
            command=["bash", "-c", self.settings.build_command],
            working_dir="/src",
            environment={**self._env(), "CCACHE_DIR": "/ccache", "HOME": "/tmp"},
            volumes={
                str(src): {"bind": "/src", "mode": "rw"},
                str(self.ccache_dir): {"bind": "/ccache", "mode": "rw"},
            },
            # Our uid, so the worktree stays removable; host network: no bridge (DESIGN.md).
            user=f"{os.getuid()}:{os.getgid()}",
            network_mode="host",
            # the tool's labels: `reset` (and a docker-backend resume) removes a build container
            # a kill -9 of bisect left behind, as it does the lifetimes'
            labels={
                "bisect.role": "build",
                LABEL_TOOL: TOOL_NAME,
                **({LABEL_SESSION: self.session} if self.session else {}),
            },
        )
        try:
            container.start()
            with log.open("wb") as out:
                # the log is copied beside the wait: the wait is what has a deadline
                copier = threading.Thread(
                    target=_copy_stream, args=(container.logs(stream=True, follow=True), out),
                    daemon=True,
                )
                copier.start()
                try:
                    with ticket.killed_on_cancel(container.kill):
                        status = container.wait(timeout=self.settings.build_timeout_s)
                except Exception:  # the SDK raises requests' ReadTimeout/ConnectionError here
                    container.kill()
                    copier.join(timeout=10)
                    return None
                copier.join(timeout=10)
            return int(status.get("StatusCode", 1))
        finally:
            container.remove(force=True)

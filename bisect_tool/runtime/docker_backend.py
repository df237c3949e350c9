"""The Docker backend: each lifetime is a fresh container of the pinned image on one GPU.

The candidate's files are bind-mounted read-only over the pinned files at the path the image
itself reports (asked once per package, never guessed: site-packages differs between images,
e.g. ``/usr/local/lib/python3.12/dist-packages`` in ``vllm/vllm-openai``). Every container uses
host networking and binds 127.0.0.1 (the engine runs with ``--bridge=none``: DESIGN.md), carries
``bisect.*`` labels so a crashed run's leftovers are found, and is removed on the way out.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import docker.types
import httpx
import requests

from bisect_tool.errors import (
    IncompatibleExtension,
    InfrastructureError,
    RecipeError,
)
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.labels import (
    ENV_LIFETIME,
    ENV_SESSION,
    LABEL_CANDIDATE,
    LABEL_LIFETIME,
    LABEL_SESSION,
    LABEL_TOOL,
    TOOL_NAME,
)
from bisect_tool.recipes.recipe import RuntimeSettings
from bisect_tool.runtime import gpu_passthrough, schemas
from bisect_tool.runtime.backend import Backend, SchemaDump
from bisect_tool.runtime.common import (
    LOOPBACK,
    PACKAGE_DIR_SCRIPT,
    RunningServer,
    open_log,
    sigterm_raises,
)
from bisect_tool.runtime.gpu_passthrough import GpuAccess, GpuMode
from bisect_tool.runtime.overlay import safe_name, split_swap_path
from bisect_tool.values import short


def labels(session: str, *, candidate: str = "", lifetime: str = "") -> dict[str, str]:
    out = {LABEL_TOOL: TOOL_NAME, LABEL_SESSION: session}
    if candidate:
        out[LABEL_CANDIDATE] = candidate
    if lifetime:
        out[LABEL_LIFETIME] = lifetime
    return out


def server_command(settings: RuntimeSettings, port: int) -> list[str]:
    if not settings.server_module:
        raise RecipeError(
            "[runtime] server_module is empty; set it, e.g. vllm.entrypoints.openai.api_server"
        )
    cmd = [settings.interpreter(), "-m", settings.server_module, *settings.server_args]
    if settings.model and "--model" not in settings.server_args:
        cmd += ["--model", settings.model]
    return [*cmd, "--host", LOOPBACK, "--port", str(port)]


def container_spec(
    settings: RuntimeSettings,
    spec: LifetimeSpec,
    *,
    port: int,
    targets: Mapping[str, str],
    gpu_access: GpuAccess | None = None,
    image_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``client.containers.create`` for one lifetime (pure).

    ``targets`` maps each swap path to the pinned file's absolute path inside the image.
    ``gpu_access`` is how the GPU reaches the container (default: the toolkit's device request);
    ``image_env`` the image's own environment, kept where a GPU variable must extend it.
    """
    access = gpu_access or GpuAccess(GpuMode.TOOLKIT)
    command = server_command(settings, port)
    mounts = [
        docker.types.Mount(
            target=targets[rel], source=str(Path(src).resolve()), type="bind", read_only=True
        )
        for rel, src in sorted(spec.swap.files.items())
    ]
    read_only_dirs = []
    if settings.model_cache:
        read_only_dirs.append(str(Path(settings.model_cache).expanduser().resolve()))
    model = Path(settings.model).expanduser() if settings.model else None
    if model is not None and model.is_absolute() and model.is_dir():
        # A checkpoint made here (weights = "random:...") or given as a host directory: the
        # server in the container loads it by the same path.
        resolved = str(model.resolve())
        if not any(resolved == d or resolved.startswith(d + "/") for d in read_only_dirs):
            read_only_dirs.append(resolved)
    mounts += [
        docker.types.Mount(target=d, source=d, type="bind", read_only=True) for d in read_only_dirs
    ]
    gpu_kwargs = access.create_kwargs(spec.gpu)
    mounts += gpu_kwargs.pop("mounts", [])
    env = {
        **access.environment(image_env or {}, {**settings.env, **spec.env}),
        **settings.env,
        **spec.env,
        ENV_SESSION: spec.session,
        ENV_LIFETIME: spec.lifetime_id,
    }
    kwargs: dict[str, Any] = {
        "image": settings.image,
        # The official image's entrypoint is `vllm serve`; the recipe's module replaces it.
        "entrypoint": command[:1],
        "command": command[1:],
        "environment": env,
        "mounts": mounts,
        "network_mode": "host",
        "shm_size": settings.shm_size,
        "labels": labels(spec.session, candidate=spec.swap.commit, lifetime=spec.lifetime_id),
        "name": container_name(spec.session, spec.lifetime_id),
        "detach": True,
        **gpu_kwargs,
    }
    return kwargs


def container_name(session: str, lifetime_id: str) -> str:
    return f"bisect-{safe_name(session)}-{safe_name(lifetime_id)}"


def _engine_error(exc: Exception) -> InfrastructureError:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return InfrastructureError(
        f"Docker engine: {first}; is it running? (make docker-up starts one)")


class _Container:
    def __init__(self, container: Any, log_path: Path) -> None:
        self.container = container
        self.log_path = log_path
        self._stopped = False
        self._lock = threading.Lock()
        self._follower = threading.Thread(target=self._follow, daemon=True)

    def start(self) -> None:
        self.container.start()
        # Follow only once started: on a created container the stream ends at once, empty.
        self._follower.start()

    def _follow(self) -> None:
        # Saved beside the journal while it runs, so the probe and the report can read it.
        from bisect_tool.redact import LineRedactor

        redactor = LineRedactor()  # a secret the server prints never reaches the file
        with contextlib.suppress(Exception), open_log(self.log_path) as log:
            for chunk in self.container.logs(stream=True, follow=True):
                log.write(redactor.feed(chunk))
            log.write(redactor.flush())

    def exit_status(self) -> str | None:
        if self._stopped:
            return "stopped"
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return "removed"
        except (docker.errors.APIError, requests.RequestException):
            return None
        state = self.container.attrs.get("State", {})
        if state.get("Status") in ("exited", "dead"):
            return f"exited with code {state.get('ExitCode')}"
        return None

    def alive(self) -> bool:
        return self.exit_status() is None

    def boot_log(self) -> str:
        return self.logs()

    def logs(self) -> str:
        try:
            return bytes(self.container.logs()).decode(errors="replace")
        except (docker.errors.APIError, requests.RequestException):
            return ""

    def stop(self, grace_s: float) -> None:
        with self._lock:
            if self._stopped:
                return
            with contextlib.suppress(docker.errors.APIError, requests.RequestException):
                self.container.stop(timeout=max(1, int(grace_s)))
            if self._follower.is_alive():
                self._follower.join(timeout=5)
            with contextlib.suppress(docker.errors.APIError, requests.RequestException):
                self.container.remove(force=True, v=True)
            self._stopped = True


class DockerBackend(Backend[_Container]):
    def __init__(
        self,
        settings: RuntimeSettings,
        *,
        session: str,
        log_dir: Path,
        docker_client: Any = None,
        http_client: httpx.Client | None = None,
        grace_s: float = 10.0,
        gpu_host: gpu_passthrough.HostView | None = None,
    ) -> None:
        if not settings.image:
            raise RecipeError("[runtime] image is empty; the docker backend needs the pinned image")
        super().__init__(
            settings, session=session, log_dir=log_dir, http_client=http_client, grace_s=grace_s
        )
        if docker_client is None:
            try:
                docker_client = docker.from_env()
                docker_client.ping()
            except (docker.errors.DockerException, requests.RequestException) as exc:
                raise _engine_error(exc) from None
        self.client = docker_client
        self._package_dirs: dict[str, str] = {}
        self._pinned_schemas: dict[str, dict[str, str] | None] = {}
        self._gpu_mode = gpu_passthrough.parse_mode(settings.docker_gpu)
        self._gpu_access: GpuAccess | None = None
        self._gpu_host = gpu_host  # where /dev, /proc and ldconfig are read (tests: a fake)
        self._image_env: dict[str, str] | None = None

    # -- what the container spec needs from the engine and this host (asked once) ---------------

    def gpu_access(self) -> GpuAccess:
        """How containers get their GPU (``[runtime] docker_gpu``; ``auto`` decided once)."""
        if self._gpu_access is None:
            runtimes: list[str] = []
            if self._gpu_mode is GpuMode.AUTO:
                with contextlib.suppress(docker.errors.APIError, requests.RequestException):
                    runtimes = list((self.client.info() or {}).get("Runtimes") or {})
            self._gpu_access = gpu_passthrough.resolve(
                self._gpu_mode, host=self._gpu_host, engine_runtimes=runtimes
            )
        return self._gpu_access

    def image_env(self) -> dict[str, str]:
        """The pinned image's own environment (``KEY=VALUE`` list of its config)."""
        if self._image_env is None:
            env: dict[str, str] = {}
            with contextlib.suppress(docker.errors.APIError, requests.RequestException):
                attrs = self.client.images.get(self.settings.image).attrs
                for item in (attrs.get("Config") or {}).get("Env") or []:
                    key, _, value = str(item).partition("=")
                    env[key] = value
            self._image_env = env
        return self._image_env

    # -- one-shot containers ---------------------------------------------------------------------

    def _run_once(
        self, argv: Sequence[str], *, mounts: Sequence[Any] = (), timeout_s: float = 300.0
    ) -> tuple[int, str, str]:
        """Run a short command in the pinned image; (exit code, stdout, stderr). Always removed."""
        access = self.gpu_access()
        gpu_kwargs = access.create_kwargs(None, one_shot=True)
        env = {**access.environment(self.image_env(), self.settings.env), **self.settings.env}
        container = self._create(
            image=self.settings.image,
            entrypoint=list(argv[:1]),
            command=list(argv[1:]),
            environment=env,
            network_mode="host",
            mounts=[*mounts, *gpu_kwargs.pop("mounts", [])],
            labels=labels(self.session),
            detach=True,
            **gpu_kwargs,
        )
        try:
            container.start()
            code = int(container.wait(timeout=timeout_s).get("StatusCode", -1))
            out = bytes(container.logs(stdout=True, stderr=False)).decode(errors="replace")
            err = bytes(container.logs(stdout=False, stderr=True)).decode(errors="replace")
            return code, out, err
        except (docker.errors.APIError, requests.RequestException) as exc:
            raise _engine_error(exc) from None
        finally:
            with contextlib.suppress(docker.errors.APIError, requests.RequestException):
                container.remove(force=True, v=True)

    def _create(self, **kwargs: Any) -> Any:
        """A container of the pinned image (``containers.create``'s arguments); an image that
        is not there names the fix, an engine that fails is infrastructure."""
        try:
            return self.client.containers.create(**kwargs)
        except docker.errors.ImageNotFound:
            raise RecipeError(
                f"image {self.settings.image} not found; build or load it, or fix [runtime] image"
            ) from None
        except (docker.errors.APIError, requests.RequestException) as exc:
            raise _engine_error(exc) from None

    def package_dir(self, pkg: str) -> str:
        """Where top-level package ``pkg`` lives inside the image (asked once, then cached)."""
        with self._lock:
            if pkg in self._package_dirs:
                return self._package_dirs[pkg]
        code, out, err = self._run_once(
            [self.settings.interpreter(), "-c", PACKAGE_DIR_SCRIPT, pkg]
        )
        if code != 0 or not out.strip():
            why = (err.strip().splitlines() or [f"exit {code}"])[-1]
            raise RecipeError(
                f"image {self.settings.image}: {self.settings.interpreter()} cannot find package "
                f"'{pkg}' ({why}); fix [runtime] image or python"
            )
        found = out.strip().splitlines()[-1]
        with self._lock:
            self._package_dirs[pkg] = found
        return found

    def targets(self, swap: SwapSet) -> dict[str, str]:
        """Each swap path's pinned location inside the image."""
        out: dict[str, str] = {}
        for rel in swap.files:
            pkg, rest = split_swap_path(rel)
            if pkg:
                out[rel] = str(PurePosixPath(self.package_dir(pkg)) / rest)
            else:  # a top-level module: beside the package directory of nothing; ask python
                raise RecipeError(
                    f"swap path '{rel}' has no package directory; give it as <package>/{rel}"
                )
        return out

    # -- lifetimes --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lifetime(self, spec: LifetimeSpec) -> Iterator[RunningServer]:
        log_path = self.log_path(spec)
        for rel, src in spec.swap.files.items():
            if not Path(src).is_file():
                raise RecipeError(f"swap file for {rel} is missing from the cache: {src}")
        targets = self.targets(spec.swap)

        def launch(port: int) -> _Container:
            kwargs = container_spec(
                self.settings,
                spec,
                port=port,
                targets=targets,
                gpu_access=self.gpu_access(),
                image_env=self.image_env(),
            )
            self._remove_named(kwargs["name"])  # a resumed lifetime after a crash
            with open_log(log_path) as log:
                log.write(f"== bisect lifetime {spec.lifetime_id} port {port}\n".encode())
            running = _Container(self._create(**kwargs), log_path)
            try:
                running.start()
            except (docker.errors.APIError, requests.RequestException) as exc:
                # e.g. no GPU runtime for the device request: the machine, not the candidate,
                # so never a verdict.
                running.stop(self.grace_s)
                raise _engine_error(exc) from None
            return running

        with sigterm_raises(), self._serve(spec, launch, what="container") as server:
            yield server

    def _remove_named(self, name: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            old = self.client.containers.get(name)
            if old.labels.get(LABEL_TOOL) == TOOL_NAME:
                old.remove(force=True, v=True)

    # -- compatibility gate -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _schema_dumps(self, swap: SwapSet) -> Iterator[tuple[SchemaDump, SchemaDump]]:
        targets = self.targets(swap)

        def candidate_for(rel: str) -> dict[str, str] | None:
            # Mounted exactly where the lifetime will mount it, so it loads as it will there.
            mount = docker.types.Mount(
                target=targets[rel],
                source=str(Path(swap.files[rel]).resolve()),
                type="bind",
                read_only=True,
            )
            what = f"candidate {short(swap.commit)} {rel}"
            return self._dump(targets[rel], what=what, mounts=[mount])

        yield (lambda rel: self._pinned_dump(targets[rel])), candidate_for

    def _pinned_dump(self, path: str) -> dict[str, str] | None:
        if path not in self._pinned_schemas:
            try:
                self._pinned_schemas[path] = self._dump(path, what=f"pinned {path}")
            except IncompatibleExtension as exc:
                raise InfrastructureError(f"{exc}; check [runtime] image") from None
        return self._pinned_schemas[path]

    def _dump(self, path: str, *, what: str, mounts: Sequence[Any] = ()) -> dict[str, str] | None:
        code, out, err = self._run_once(
            schemas.dump_command(self.settings.interpreter(), path), mounts=mounts
        )
        if code != 0:
            last = (err.strip().splitlines() or [f"exit {code}"])[-1]
            raise IncompatibleExtension(f"{what} does not load in the pinned stack: {last}")
        return schemas.parse_dump(out, what)

    # -- crash leftovers --------------------------------------------------------------------------

    def cleanup_stale(self, session: str | None = None) -> int:
        """Remove containers labelled ``bisect.tool=bisect`` (of one session, or all); count.

        Lifetimes this backend is running now are kept.
        """
        wanted = [f"{LABEL_TOOL}={TOOL_NAME}"]
        if session is not None:
            wanted.append(f"{LABEL_SESSION}={session}")
        try:
            found = self.client.containers.list(all=True, filters={"label": wanted})
        except (docker.errors.APIError, requests.RequestException) as exc:
            raise _engine_error(exc) from None
        with self._lock:
            live = {c.container.id for c in self._live.values()}
        count = 0
        for container in found:
            if container.id in live:
                continue
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)
                count += 1
        return count

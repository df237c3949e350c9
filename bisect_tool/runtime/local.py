"""The local backend: each lifetime is a fresh child process group of the pinned interpreter.

Runs anywhere, including the lent GPU machine that has no Docker. The candidate's compiled files
reach the server through a private overlay of the pinned package put first on PYTHONPATH (see
``overlay.py``); the server binds 127.0.0.1 on a free port and is killed as a whole process group
on the way out, whatever happened inside.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bisect_tool import redact
from bisect_tool.errors import IncompatibleExtension, InfrastructureError, RecipeError
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.labels import ENV_LIFETIME, ENV_SESSION
from bisect_tool.recipes.recipe import RuntimeSettings
from bisect_tool.runtime import schemas
from bisect_tool.runtime.backend import Backend, SchemaDump
from bisect_tool.runtime.common import (
    LOOPBACK,
    NEUTRAL_CWD,
    PACKAGE_DIR_SCRIPT,
    RunningServer,
    sigterm_raises,
)
from bisect_tool.runtime.logpump import open_pump
from bisect_tool.runtime.overlay import OVERLAY_PREFIX, overlay, safe_name, split_swap_path
from bisect_tool.values import short


class _Server:
    """One child process group; the leader is never reaped before the group is killed, so its
    pid (= the group id) cannot be reused by an unrelated process while we signal the group."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        log_path: Path,
        log_start: int,
        pump: Any = None,
        log: Any = None,
    ) -> None:
        self.proc = proc
        self.log_path = log_path
        self.log_start = log_start
        self._lock = threading.Lock()
        self._stopped = False
        self._pump = pump  # the redacting copy of its output into the log (logpump.py)
        self._log = log

    def exit_status(self) -> str | None:
        if self._stopped:
            return "stopped"
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "exited"
        if info is None:
            return None
        if info.si_code == os.CLD_EXITED:
            return f"exited with code {info.si_status}"
        return f"killed by signal {info.si_status}"

    def alive(self) -> bool:
        return self.exit_status() is None

    def boot_log(self) -> str:
        if self._pump is not None and not self.alive():
            self._pump.drain(2.0)  # its last words (the traceback) are in the log first
        return _read_from(self.log_path, self.log_start)

    def stop(self, grace_s: float) -> None:
        with self._lock:
            if self._stopped:
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            # SIGKILL the group even when the leader left in time: its children may not have.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            if self._pump is not None:  # its last words are in the log before anyone reads it
                self._pump.drain()
                self._log.close()
            self._stopped = True


class LocalBackend(Backend[_Server]):
    def __init__(
        self,
        settings: RuntimeSettings,
        *,
        session: str,
        log_dir: Path,
        http_client: httpx.Client | None = None,
        grace_s: float = 10.0,
        overlay_parent: Path | None = None,
    ) -> None:
        super().__init__(
            settings, session=session, log_dir=log_dir, http_client=http_client, grace_s=grace_s
        )
        self.overlay_parent = overlay_parent
        self._package_dirs: dict[str, Path] = {}
        self._pinned_schemas: dict[str, dict[str, str]] = {}

    # -- where the pinned package is ------------------------------------------------------------

    def package_dir(self, pkg: str) -> Path:
        """The pinned directory of top-level package ``pkg`` (cached)."""
        with self._lock:
            if pkg in self._package_dirs:
                return self._package_dirs[pkg]
        found = self._find_package_dir(pkg)
        with self._lock:
            self._package_dirs[pkg] = found
        return found

    def _find_package_dir(self, pkg: str) -> Path:
        given = self.settings.pinned_package_dir
        if given:
            root = Path(given).expanduser()
            if (root / pkg).is_dir():
                return (root / pkg).absolute()
            if root.name == pkg and root.is_dir():
                return root.absolute()
            raise RecipeError(
                f"pinned package '{pkg}' not found under {root}; set [runtime] "
                'pinned_package_dir to the site-packages that holds it (or "" to ask python)'
            )
        try:
            done = subprocess.run(
                [self.settings.interpreter(), "-c", PACKAGE_DIR_SCRIPT, pkg],
                capture_output=True,
                text=True,
                timeout=120,
                env=self._base_env(),
                cwd=NEUTRAL_CWD,  # a vLLM source checkout in the caller's would shadow
                check=False,
            )
        except FileNotFoundError:
            raise RecipeError(
                f"pinned interpreter not found: {self.settings.interpreter()}; set [runtime] "
                "python"
            ) from None
        if done.returncode != 0 or not done.stdout.strip():
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RecipeError(
                f"{self.settings.interpreter()} cannot find package '{pkg}' ({why}); set [runtime] "
                "python to the pinned stack's interpreter or pinned_package_dir"
            )
        return Path(done.stdout.strip().splitlines()[-1])

    def _base_env(self) -> dict[str, str]:
        return {**os.environ, **self.settings.env}

    # -- lifetimes --------------------------------------------------------------------------------

    def _command(self, port: int) -> list[str]:
        s = self.settings
        if not s.server_module:
            raise RecipeError(
                "[runtime] server_module is empty; set it, e.g. vllm.entrypoints.openai.api_server"
            )
        cmd = [s.interpreter(), "-m", s.server_module, *s.server_args]
        if s.model and "--model" not in s.server_args:
            model = Path(s.model).expanduser()
            # The server runs in the overlay directory: a relative model path must be absolute.
            cmd += ["--model", str(model.absolute()) if model.exists() else s.model]
        return [*cmd, "--host", LOOPBACK, "--port", str(port)]

    def _env(self, spec: LifetimeSpec, root: Path) -> dict[str, str]:
        env = {**self._base_env(), **spec.env}
        rest = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = str(root) + (os.pathsep + rest if rest else "")
        if spec.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = spec.gpu
        env[ENV_SESSION] = spec.session
        env[ENV_LIFETIME] = spec.lifetime_id
        return env

    @contextlib.contextmanager
    def lifetime(self, spec: LifetimeSpec) -> Iterator[RunningServer]:
        log_path = self.log_path(spec)
        tag = f"{spec.session}-{spec.lifetime_id}"
        with (
            sigterm_raises(),
            overlay(spec.swap.files, self.package_dir, tag=tag, parent=self.overlay_parent,
                    whole=spec.swap.whole_packages) as root,
        ):

            def launch(port: int) -> _Server:
                cmd = self._command(port)
                # The child writes to a pipe that reaches the log redacted (logpump.py).
                log, pump = open_pump(log_path)
                start = log.tell()
                header = f"== bisect lifetime {spec.lifetime_id} port {port}: {cmd}\n"
                log.write(redact.text(header).encode())
                try:
                    proc = subprocess.Popen(
                        cmd,
                        stdout=pump.fd,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        cwd=root,
                        env=self._env(spec, root),
                    )
                except OSError as exc:
                    pump.child_started()
                    pump.drain()
                    log.close()
                    raise InfrastructureError(
                        f"cannot start {cmd[0]}: {exc}; set [runtime] python"
                    ) from None
                pump.child_started()
                return _Server(proc, log_path, start, pump, log)

            with self._serve(spec, launch) as server:
                yield server

    # -- compatibility gate -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _schema_dumps(self, swap: SwapSet) -> Iterator[tuple[SchemaDump, SchemaDump]]:
        with overlay(
            swap.files,
            self.package_dir,
            tag=f"{self.session}-check-{short(swap.commit)}",
            parent=self.overlay_parent,
        ) as root:

            def candidate_for(rel: str) -> dict[str, str] | None:
                what = f"candidate {short(swap.commit)} {rel}"
                return schemas.dump_local(self.settings.interpreter(), str(root / rel), what=what)

            yield self._pinned_dump, candidate_for

    def _pinned_dump(self, rel: str) -> dict[str, str] | None:
        if rel in self._pinned_schemas:
            return self._pinned_schemas[rel]
        pkg, rest = split_swap_path(rel)
        path = self.package_dir(pkg) / rest if pkg else None
        if path is None or not path.is_file():
            return None
        try:
            dump = schemas.dump_local(
                self.settings.interpreter(), str(path), what=f"pinned {rel}"
            )
        except IncompatibleExtension as exc:
            # The pinned stack's own extension must load; if not, no candidate can be judged.
            raise InfrastructureError(f"{exc}; check [runtime] python") from None
        if dump is not None:
            self._pinned_schemas[rel] = dump
        return dump

    # -- crash leftovers --------------------------------------------------------------------------

    def cleanup_stale(self, session: str | None = None) -> int:
        """Kill server process groups and remove overlays an earlier run left behind.

        Finds the servers by the ``BISECT_SESSION`` their environment carries; ``session=None``
        means every session (``bisect reset``). Lifetimes of this backend still running are kept.
        """
        count = 0
        mine = {s.proc.pid for s in self._live.values()}
        own_group = os.getpgrp()
        groups: set[int] = set()
        for pid in pids_with_env(ENV_SESSION, session):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group != own_group and group not in mine:
                    groups.add(group)
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
                count += 1
        parent = self.overlay_parent or Path(tempfile.gettempdir())
        pattern = f"{OVERLAY_PREFIX}{safe_name(session) + '-' if session else ''}*"
        live_tags = {safe_name(f"{self.session}-{lid}") for lid in self._live}
        for path in parent.glob(pattern):
            if any(path.name.startswith(f"{OVERLAY_PREFIX}{tag}-") for tag in live_tags):
                continue
            shutil.rmtree(path, ignore_errors=True)
            count += 1
        return count


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def pids_with_env(name: str, value: str | None) -> list[int]:
    """Processes of this user whose environment sets ``name`` (to ``value`` when given)."""
    wanted = f"{name}={value}".encode() if value is not None else f"{name}=".encode()
    found: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item == wanted if value is not None else item.startswith(wanted):
                found.append(int(entry.name))
                break
    return found

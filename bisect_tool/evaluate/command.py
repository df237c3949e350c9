"""``bisect start --run CMD``: the generic probe, with ``git bisect run`` exit codes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bisect_tool.errors import (
    AbortError,
)
from bisect_tool.values import Observation, Verdict
from bisect_tool.worktrees import remove_stale_worktrees, worktree

Progress = Callable[[str], None]


_SIGNALS = {int(sig) for sig in signal.Signals}
class RunCommandEvaluator:
    """``bisect start --run CMD``: the generic probe, with ``git bisect run`` exit codes.

    0 = good (CLEAN), 125 = untestable, 1..127 otherwise = bad (DIVERGENT),
    >= 128 (killed by a signal) or a timeout = abort the whole run.
    """

    def __init__(
        self,
        repo_path: Path,
        command: str,
        timeout_s: float = 0.0,
        *,
        state_dir: Path | None = None,
        session: str = "",
        progress: Progress | None = None,
    ) -> None:
        from bisect_tool.children import Registry

        self.repo_path = repo_path
        self.command = command
        self.timeout_s = timeout_s or None
        # Each probe's group is recorded there and labelled with the session, so a `resume` or
        # `reset` after a kill -9 of this process can end it (children.py).
        self.children = Registry(state_dir) if state_dir is not None else None
        self.session = session
        self.progress = progress or (lambda _msg: None)
        self._first = True
        remove_stale_worktrees(repo_path)

    def prepare(self, commits: Sequence[str]) -> None:
        return None

    def cancel(self) -> int:
        return 0  # the command's process group ends with the lifetime

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        started = time.monotonic()
        from bisect_tool import runprobe
        from bisect_tool.labels import ENV_SESSION

        with worktree(self.repo_path, commit) as path:
            env = {**os.environ, "BISECT_COMMIT": commit, "BISECT_LIFETIME": lifetime_id}
            if self.session:
                env[ENV_SESSION] = self.session
            first, self._first = self._first, False
            if first:
                self.progress(runprobe.banner(path, commit))
            proc = subprocess.Popen(
                ["bash", "-c", self.command],
                cwd=path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            tracked = (
                self.children.tracked(proc.pid, f"--run at {commit[:12]}")
                if self.children is not None
                else contextlib.nullcontext()
            )
            try:
                with tracked:
                    out, _ = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise AbortError(
                    f"--run command timed out after {self.timeout_s:.0f}s at {commit[:12]}; "
                    "raise --run-timeout or make the command exit 125 when it cannot decide"
                ) from None
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise
            code = proc.returncode
            text = out.decode(errors="replace")
            # asked while the worktree exists: does the path the command named exist there?
            problem = runprobe.exit_problem(code, text, self.command, path, commit)
        if problem:
            raise AbortError(problem)
        tail = "\n".join(text.splitlines()[-20:])
        if first:  # the log says where the command ran (relative paths resolve from there)
            tail = runprobe.banner(path, commit) + "\n" + tail
        elapsed = time.monotonic() - started
        detail: dict[str, Any] = {"exit_code": code, "log_tail": tail}
        if code == 0:
            verdict = Verdict.CLEAN
        elif code == 125:
            verdict = Verdict.UNTESTABLE
        elif 0 < code < 128:
            verdict = Verdict.DIVERGENT
        else:
            # Popen reports death by a signal as -N; bash reports it as 128 + N
            how = f"by {signal.Signals(-code).name}" if -code in _SIGNALS else f"(exit {code})"
            raise AbortError(
                f"--run command was killed {how} at {commit[:12]}; exit codes >= 128 "
                "abort the bisect, like git bisect run"
            )
        return Observation(commit, verdict, lifetime_id, detail, f"exit {code}", elapsed)



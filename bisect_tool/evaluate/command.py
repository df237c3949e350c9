"""``bisect start --run CMD``: the generic probe, with ``git bisect run`` exit codes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bisect_tool.errors import (
    AbortError,
)
from bisect_tool.range.newer_tests import ENV_FOLDER, NewerTests, ensure, place
from bisect_tool.range.worktrees import WorktreeError, confined, remove_stale_worktrees, worktree
from bisect_tool.runtime import runprobe
from bisect_tool.values import Observation, Verdict

Progress = Callable[[str], None]


_SIGNALS = {int(sig) for sig in signal.Signals}
#: lines of a --run command's output that its observation keeps (the whole output is in its log)
_TAIL_LINES = 20


class RunCommandEvaluator:
    """``bisect start --run CMD``: the generic probe, with ``git bisect run`` exit codes.

    0 = good (CLEAN), 125 = untestable, 1..127 but 125 = bad (DIVERGENT); 126/127 with the
    shell's own "cannot execute"/"not found" line = the command never ran (abort, see
    ``runprobe.exit_problem``); >= 128 (killed by a signal) or a timeout = abort the whole run.

    Each lifetime is its own process group (``runprobe.run_group``), ended whole when the
    command returns: a background child cannot stretch the lifetime or outlive it. Its output
    goes to ``<state dir>/logs/<lifetime>.log``; the observation keeps the last lines.
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
        test_from: NewerTests | None = None,
    ) -> None:
        from bisect_tool.runtime.children import Registry

        self.repo_path = repo_path
        # --test-from: a newer commit's test files, put into each candidate's worktree
        self.test_from = test_from
        self.command = command
        self.timeout_s = timeout_s or None
        # Each probe's group is recorded there and labelled with the session, so a `resume` or
        # `reset` after a kill -9 of this process can end it (children.py).
        self.children = Registry(state_dir) if state_dir is not None else None
        self.log_dir = state_dir / "logs" if state_dir is not None else None
        self.session = session
        self.progress = progress or (lambda _msg: None)
        self._first = True
        remove_stale_worktrees(repo_path)

    def prepare(self, commits: Sequence[str]) -> None:
        return None

    def cancel(self) -> int:
        return 0  # the command's process group ends with the lifetime

    def _log(self, lifetime_id: str) -> Path | None:
        from bisect_tool.runtime.overlay import safe_name

        return self.log_dir / f"{safe_name(lifetime_id)}.log" if self.log_dir else None

    def _run(
        self, path: Path, commit: str, lifetime_id: str, log: Path | None
    ) -> runprobe.Finished:
        """The command in the worktree ``path``, as its own process group, until it returns."""
        from bisect_tool.labels import ENV_LIFETIME, ENV_SESSION

        env = {**os.environ, **confined(path), "BISECT_COMMIT": commit, ENV_LIFETIME: lifetime_id}
        borrowed = ""
        if self.test_from is not None:
            tests = self.test_from
            ensure(self.repo_path, tests.sha, tests.files, tests.folder)
            placed = place(tests, path)
            env[ENV_FOLDER] = str(tests.folder)
            borrowed = (f" (with {', '.join(placed)} of {tests.ref} {tests.sha[:12]}, "
                        f"from {tests.folder})")
        label = None
        if self.session:
            env[ENV_SESSION] = self.session
            label = {ENV_SESSION: self.session, ENV_LIFETIME: lifetime_id}
        children = self.children
        ran = runprobe.run_group(
            ["bash", "-c", self.command],
            cwd=path,
            env=env,
            timeout_s=self.timeout_s,
            log=log,
            log_header=f"== bisect --run at {commit} lifetime {lifetime_id} in {path}"
            f"{borrowed}: {self.command}",
            track=(
                (lambda pgid: children.tracked(pgid, f"--run at {commit[:12]}"))
                if children is not None
                else None
            ),
            label=label,
        )
        if ran.timed_out:
            raise AbortError(
                f"--run command timed out after {self.timeout_s:.0f}s at {commit[:12]}; "
                "raise --run-timeout or make the command exit 125 when it cannot decide"
            )
        return ran

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        started = time.monotonic()
        first, self._first = self._first, False
        log = self._log(lifetime_id)
        try:
            with worktree(self.repo_path, commit, session=self.session) as path:
                if first:
                    self.progress(runprobe.banner(path, commit))
                ran = self._run(path, commit, lifetime_id, log)
                code = ran.code
                assert code is not None
                # asked while the worktree exists: does the path the command named exist there?
                problem = runprobe.exit_problem(code, ran.output, self.command, path, commit)
        except WorktreeError as exc:
            raise WorktreeError(
                f"cannot check out {commit[:12]} of {self.repo_path} for --run: {exc}"
            ) from None
        if problem:
            raise AbortError(problem)
        lines = ran.output.splitlines()[-_TAIL_LINES:]
        if ran.printed > ran.kept and log is not None:
            lines.insert(0, f"[{ran.printed:,} bytes printed; all of them are in {log}]")
        tail = "\n".join(lines)
        if first:  # the log says where the command ran (relative paths resolve from there)
            tail = runprobe.banner(path, commit) + "\n" + tail
        elapsed = time.monotonic() - started
        detail: dict[str, Any] = {"exit_code": code, "log_tail": tail}
        if log is not None:
            detail["log"] = str(log)
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
